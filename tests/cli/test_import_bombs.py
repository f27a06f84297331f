"""rollout-golden import: small dumps that would make it allocate far more than they hold,
and errors that name the dump file and step among many (issue 16, items 8 and 16)."""

from __future__ import annotations

import collections
import pickle
import struct
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import pytest
import torch

from pytest_rollout_golden import Golden, Mode, dumps
from pytest_rollout_golden.cli import main

LIMIT = 3 << 30  # address space of the importing process: each bomb asks for more
LIMITED_IMPORT = """
import resource, sys
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from pytest_rollout_golden.cli import main
code = main(["import", *sys.argv[2:]])
peak = open("/proc/self/status").read().split("VmPeak:")[1].split()[0]
print(f"VmPeak {int(peak) << 10}")
sys.exit(code)
"""
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS bounds memory on Linux")


def import_limited(source: Path, target: Path, limit: int = LIMIT) -> subprocess.CompletedProcess:
    """`rollout-golden import` in a process that cannot map more than ``limit`` bytes."""
    args = [sys.executable, "-c", LIMITED_IMPORT, str(limit), str(source), "-o", str(target)]
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def areal_line(root: Path, line: str) -> Path:
    """An AReaL dump of one version (3) and one task whose one line is ``line``."""
    path = root / "rollout" / "3" / "0.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(line + "\n")
    return path


def documented_limit(tmp_path: Path, dump: Path) -> int:
    """The address space an import of ``dump`` may use: what importing a one-record dump maps,
    plus the allowance of a dump of its size (64x its size on disk + 64 MiB)."""
    small = areal_line(tmp_path / "small", '{"task_id": 0, "reward": 1.0}')
    result = import_limited(small.parents[2], tmp_path / "small_golden")
    assert result.returncode == 0, result.stderr
    baseline = int(result.stdout.split("VmPeak ")[1])
    size = sum(p.stat().st_size for p in dump.rglob("*") if p.is_file())
    return baseline + dumps.loading.EXPAND_FACTOR * size + dumps.loading.EXPAND_FREE


class _Storage:
    """Stands for the archive's storage record ``data/0`` in a hand-written data.pkl."""


class _Tensor:
    """Pickles as torch.save pickles a uint8 tensor of ``size`` bytes over ``_Storage``."""

    def __init__(self, size: int):
        self.size = size

    def __reduce__(self):
        args = (_Storage, 0, (self.size,), (1,), False, collections.OrderedDict())
        return (torch._utils._rebuild_tensor_v2, args)


class _Pickler(pickle.Pickler):
    def __init__(self, file, size: int):
        super().__init__(file, protocol=2)
        self.size = size

    def persistent_id(self, obj):
        return ("storage", torch.ByteStorage, "0", "cpu", self.size) if obj is _Storage else None


def deflated_zeros(size: int) -> tuple[bytes, int]:
    """A raw deflate stream of ``size`` zero bytes (~1 KiB per MiB) and their CRC-32."""
    mib = bytes(1 << 20)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    # A full flush resets the compressor, so every further MiB compresses to these bytes.
    chunk = compressor.compress(mib) + compressor.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(size >> 20):
        crc = zlib.crc32(mib, crc)
    return chunk * (size >> 20) + compressor.flush(), crc


def write_zip_bomb(path: Path, size: int) -> None:
    """A torch.save archive of a ``size``-byte uint8 tensor, its record deflated to ~size/1000."""
    torch.save(torch.zeros(1, dtype=torch.uint8), path)  # for torch.save's other records
    with zipfile.ZipFile(path) as archive:
        records = {info.filename: archive.read(info) for info in archive.infolist()}
    prefix = next(iter(records)).split("/")[0]
    with open(path, "wb") as f:
        _Pickler(f, size).dump(_Tensor(size))
    records[f"{prefix}/data.pkl"] = path.read_bytes()
    local, central = bytearray(), bytearray()
    for name, data in records.items():
        if name == f"{prefix}/data/0":
            (body, crc), method, inflated = deflated_zeros(size), zipfile.ZIP_DEFLATED, size
        else:
            body, crc, method, inflated = data, zlib.crc32(data), zipfile.ZIP_STORED, len(data)
        sizes = (crc, len(body), inflated, len(name.encode()))
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0,
                               *sizes, 0, 0, 0, 0, 0, len(local))  # fmt: skip
        central += name.encode()
        local += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0, *sizes, 0)
        local += name.encode() + body
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(records), len(records),
                      len(central), len(local), 0)  # fmt: skip
    path.write_bytes(local + central + end)


@linux_only
def test_a_stride_0_tensor_is_refused_before_it_is_copied_out(tmp_path):
    """Item 8: 1.5 kB on disk, 32 GiB once made contiguous."""
    dump = tmp_path / "dump" / "trajectory"
    dump.mkdir(parents=True)
    bomb = torch.zeros(1).as_strided((2**33,), (0,))
    torch.save({"input_ids": torch.arange(4), "old_log_probs": bomb}, dump / "step_000003.pt")
    assert (dump / "step_000003.pt").stat().st_size < 2000

    result = import_limited(tmp_path / "dump", tmp_path / "golden")
    assert result.returncode == 2, result.stderr
    err = result.stderr
    assert f"step 3, {dump / 'step_000003.pt'}: the tensor at ['old_log_probs']" in err
    assert "views 4 bytes of storage as 34,359,738,368 bytes" in err
    assert "stride-0" in err and "save `t.contiguous()`" in err
    assert not (tmp_path / "golden").exists()


@linux_only
def test_a_deflated_record_is_refused_before_torch_load_inflates_it(tmp_path):
    """Item 8: a ~4 MB archive whose one record inflates to 4 GiB of zeros."""
    dump = tmp_path / "dump"
    dump.mkdir()
    size = (4 << 30) - (1 << 20)  # 4 GiB less 1 MiB: no zip64 needed
    write_zip_bomb(dump / "step_000005.pt", size)
    with zipfile.ZipFile(dump / "step_000005.pt") as archive:
        assert archive.getinfo("step_000005/data/0").file_size == size  # the bomb is real
    assert (dump / "step_000005.pt").stat().st_size < 5_000_000

    result = import_limited(dump, tmp_path / "golden")
    assert result.returncode == 2, result.stderr
    err = result.stderr
    assert f"step 5, {dump / 'step_000005.pt'}: member step_000005/data/0 inflates" in err
    assert f"to {size:,} bytes, more than 64x" in err and "decompression bomb" in err
    assert not (tmp_path / "golden").exists()


@linux_only
def test_a_jsonl_line_of_empty_objects_is_refused_within_the_documented_bound(tmp_path):
    """17 MB of ``{}`` once made the import allocate 148 times the file: it is refused,
    naming the file and the line, before the import maps more than the bound."""
    path = areal_line(tmp_path / "dump", "[" + ",".join(["{}"] * 5_800_000) + "]")
    limit = documented_limit(tmp_path, tmp_path / "dump")

    result = import_limited(tmp_path / "dump", tmp_path / "golden", limit)
    assert result.returncode == 2, result.stderr[-2000:]
    err = result.stderr
    assert f"step 3, {path}: its payload expands past " in err
    assert "(reached at line 1, [" in err and "64x its size + 64 MiB" in err
    assert not (tmp_path / "golden").exists()


@linux_only
def test_a_jsonl_line_of_empty_objects_within_the_allowance_imports_within_it(tmp_path):
    """What the expansion check accepts stays within the bound it documents."""
    areal_line(tmp_path / "dump", "[" + ",".join(["{}"] * 150_000) + "]")
    limit = documented_limit(tmp_path, tmp_path / "dump")
    result = import_limited(tmp_path / "dump", tmp_path / "golden", limit)
    assert result.returncode == 0, result.stderr[-2000:]
    assert main(["verify", str(tmp_path / "golden")]) == 0


def test_a_torch_save_of_one_dict_many_times_is_charged_what_converting_it_costs(tmp_path, capsys):
    """Each reference to the one dict takes 2 bytes of pickle and ~450 of memory once
    converted: charged so, it is refused before it is converted."""
    dump = tmp_path / "dump" / "trajectory"
    dump.mkdir(parents=True)
    torch.save([{}] * 2_000_000, dump / "step_000001.pt")
    assert (dump / "step_000001.pt").stat().st_size < 5_000_000

    assert main(["import", str(tmp_path / "dump"), "-o", str(tmp_path / "golden")]) == 2
    err = capsys.readouterr().err
    assert f"error: step 1, {dump / 'step_000001.pt'}: its payload expands past " in err
    assert "(reached at [" in err and "very many small containers" in err
    assert not (tmp_path / "golden").exists()


def test_a_small_expanded_tensor_still_imports(tmp_path):
    """Views that stay within the file's allowance (64x + 64 MiB) are copied out as usual."""
    dump = tmp_path / "dump" / "trajectory"
    dump.mkdir(parents=True)
    mask = torch.ones(1, 8, dtype=torch.bool).expand(4, 8)
    torch.save({"attention_mask": mask}, dump / "step_000000.pt")
    assert main(["import", str(tmp_path / "dump"), "-o", str(tmp_path / "golden")]) == 0
    with Golden(tmp_path / "golden", mode=Mode.STRICT) as g:
        replayed = g.rollout(lambda: pytest.fail("generated"), step=0)
    assert torch.equal(replayed["attention_mask"], mask)


def _truncated(path: Path) -> None:
    torch.save([{"x": torch.arange(64)}], path)
    path.write_bytes(path.read_bytes()[:300])


def _sparse(path: Path) -> None:
    torch.save([{"x": torch.zeros(3).to_sparse()}], path)


def _holds_itself(path: Path) -> None:
    rows: list = [{"x": torch.zeros(2)}]
    rows.append(rows)
    torch.save(rows, path)


@pytest.mark.parametrize(
    ("damage", "what"),
    [
        (_truncated, "is not a readable torch.save archive"),
        (_sparse, "is sparse or quantized"),
        (_holds_itself, "or holding itself"),
    ],
    ids=["truncated", "sparse", "holds-itself"],
)
def test_an_error_among_many_dumps_names_the_file_and_the_step(
    tmp_path, capsys, monkeypatch, damage, what
):
    """Item 16: one bad file among many; the error says which, at which step, and why."""
    monkeypatch.setattr(dumps.loading, "EXPAND_FREE", 1 << 20)  # the self-holding list stops sooner
    dump = tmp_path / "dump"
    dump.mkdir()
    for step in (1, 2, 3, 5):
        torch.save([{"x": torch.arange(4) + step}], dump / f"step_{step:06d}.pt")
    damage(dump / "step_000004.pt")

    assert main(["import", str(dump), "-o", str(tmp_path / "golden")]) == 2
    err = capsys.readouterr().err
    assert f"error: step 4, {dump / 'step_000004.pt'}: " in err
    assert what in err
    assert not (tmp_path / "golden").exists()
