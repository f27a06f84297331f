"""Reference quantization formats (FP8 tensorwise and blockwise, MXFP8, NVFP4) in float64.

``quantize(x, "mxfp8_e4m3")`` returns the codes and scales the format's published definition
gives; ``dequantize`` multiplies them back; ``error_bound(x, fmt)`` is the per-element bound on
the round-trip error that the format itself implies. See
:mod:`~pytest_rollout_golden.quant.formats` for the definitions, their sources and the
choices where sources differ.

Between the trainer and the rollout engine: :mod:`.manifest` says which precision each side
uses, parameter by parameter (``golden.check_precision`` records it), and :mod:`.sync` checks
what a weight sync delivered against the trainer's master weights.
"""

from .formats import (
    ELEMENTS,
    FORMATS,
    Element,
    Format,
    Quantized,
    dequantize,
    error_bound,
    quantize,
    resolve,
    round_element,
)

__all__ = [
    "ELEMENTS",
    "FORMATS",
    "Element",
    "Format",
    "Quantized",
    "dequantize",
    "error_bound",
    "quantize",
    "resolve",
    "round_element",
]
