"""Writes into a collection of many banks cost what they change (issue 33): a bank's write finds
its side directories (a compaction's private copy) by name, never by listing the directory that
holds every bank of the collection; the clean-up after killed writers (``sweep``) lists it once per
write call, and still finds the copies earlier releases named with a random suffix."""
from __future__ import annotations

from pathlib import Path

from trawmem_gpu.store import Collection
from trawmem_gpu.store.writes import COMPACT, compaction_dir

from benchmarks.synthetic_banks import make_banks


def _listings(monkeypatch, bdir: Path) -> list[str]:
    """Record every ``glob`` / ``iterdir`` of ``bdir`` (the banks directory)."""
    seen = []
    real_glob, real_iterdir = Path.glob, Path.iterdir

    def glob(self, pattern, *a, **k):
        if self == bdir:
            seen.append(f"glob {pattern}")
        return real_glob(self, pattern, *a, **k)

    def iterdir(self):
        if self == bdir:
            seen.append("iterdir")
        return real_iterdir(self)

    monkeypatch.setattr(Path, "glob", glob)
    monkeypatch.setattr(Path, "iterdir", iterdir)
    return seen


def test_a_write_of_many_banks_lists_the_banks_directory_once(tmp_path, monkeypatch):
    banks = make_banks(12, units=10, d=16, seed=3, prefix="t")
    coll = Collection(tmp_path / "c", create=True)
    coll.put_many(banks[:4])
    seen = _listings(monkeypatch, coll.path / "banks")
    coll.put_many(banks[4:], group=64)  # 8 new banks, one call
    assert seen == ["iterdir"], seen  # the sweep's; before, one glob per bank for compaction copies
    seen.clear()
    coll.put_many(banks[:3], group=64)  # rewrites of stored banks
    assert seen == ["iterdir"], seen
    assert sorted(Collection(tmp_path / "c").bank_ids) == sorted(b.bank_id for b in banks)


def test_a_rewrite_removes_a_killed_compactions_copy_by_its_name(tmp_path):
    """A compaction killed after it wrote its copy leaves the bank's compaction directory; a
    rewrite of the bank (a forget) must not let that copy outlive it."""
    bank = make_banks(1, units=10, d=16, seed=4, prefix="k")[0]
    coll = Collection(tmp_path / "c", create=True)
    coll.put(bank)
    left = compaction_dir(coll.path / "banks", coll.banks[bank.bank_id])
    left.mkdir()
    (left / "tensors.safetensors").write_bytes(b"the old bank's vectors")
    coll.put(make_banks(1, units=6, d=16, seed=5, prefix="k")[0])
    assert not left.exists()


def test_sweep_still_removes_copies_with_the_earlier_random_names(tmp_path):
    bank = make_banks(1, units=10, d=16, seed=6, prefix="r")[0]
    coll = Collection(tmp_path / "c", create=True)
    coll.put(bank)
    name = coll.banks[bank.bank_id]
    legacy = coll.path / "banks" / f".{name}{COMPACT}0123456789ab"
    orphan = coll.path / "banks" / f".gone{COMPACT}ba9876543210"  # of a bank the index no longer names
    for d in (legacy, orphan):
        d.mkdir()
        (d / "x").write_bytes(b"copy")
    Collection(tmp_path / "c").put_many([make_banks(1, units=10, d=16, seed=7, prefix="s")[0]])
    assert not legacy.exists() and not orphan.exists()
    assert Collection(tmp_path / "c").load(bank.bank_id).n_units == 10
