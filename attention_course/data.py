"""Multi30k (task 1, raw) and the course's toy corpus: download, verify, cache, read.

Multi30k's raw files come from the dataset's public GitHub repository (multi30k/dataset,
``data/task1/raw/``), pinned to one commit, and are checked against the SHA256 manifest committed
in ``data/multi30k/SHA256SUMS``. Where they come from, in order:

1. a verified copy in the cache (``data/cache/multi30k/``, git-ignored);
2. a local mirror: the ``mirror`` argument, or the ``ATTN_MULTI30K_MIRROR`` environment variable
   (a folder holding ``train.en.gz`` etc.; CI points it at a shared read-only copy);
3. a download from GitHub into the cache, with a progress bar.

A file whose checksum does not match is never used; the error names it. Nothing that verified
is ever deleted.

``multi30k_availability`` says, without hanging, whether Multi30k can be had here (cache, mirror,
or a download with a short timeout); notebook 06 falls back to the toy corpus when it cannot,
with a message that says so and how to get the real data.

See ``data/multi30k/README.md`` for the citation and the terms of use (non-commercial research
and educational purposes).
"""
from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .paths import course_file, lazy_paths

MIRROR_ENV = "ATTN_MULTI30K_MIRROR"
CACHE_ENV = "ATTN_DATA_CACHE"
COMMIT = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"
BASE_URL = f"https://raw.githubusercontent.com/multi30k/dataset/{COMMIT}/data/task1/raw/"
BROWSE_URL = f"https://github.com/multi30k/dataset/tree/{COMMIT}/data/task1/raw"

SPLITS = ("train", "val", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")
TEST_SETS = ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")
LANGUAGES = ("en", "de", "fr")
TOY_SPLITS = ("train", "val", "test")


class DataUnavailable(FileNotFoundError):
    """The data could be found neither in the cache, nor in a mirror, nor on the internet."""


class ChecksumMismatch(ValueError):
    """A file's SHA256 differs from the committed manifest."""


def data_dir() -> Path:
    """The course's data/ folder: the manifest, the data card, the toy corpus, the download cache."""
    return course_file("data")


def manifest_path() -> Path:
    return data_dir() / "multi30k" / "SHA256SUMS"


def toy_dir() -> Path:
    return data_dir() / "toy"


__getattr__ = lazy_paths(__name__, {"DATA": data_dir, "MANIFEST": manifest_path, "TOY": toy_dir})  # DATA, MANIFEST, TOY: looked up when asked for


def default_cache() -> Path:
    return Path(os.environ.get(CACHE_ENV) or data_dir() / "cache") / "multi30k" / "task1" / "raw"


def file_name(split: str, lang: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"unknown Multi30k split {split!r}; choose one of {', '.join(SPLITS)}")
    if lang not in LANGUAGES:
        raise ValueError(f"unknown language {lang!r}; choose one of {', '.join(LANGUAGES)}")
    return f"{split}.{lang}.gz"


def read_manifest(path: Path | None = None) -> dict[str, str]:
    """file name -> expected SHA256, from a `sha256sum`-style file (default: the course's manifest)."""
    path = path if path is not None else manifest_path()
    if not Path(path).is_file():
        raise FileNotFoundError(f"the checksum manifest {path} is missing (it is part of the repository)")
    sums = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            sums[name.strip().lstrip("*")] = digest.lower()
    return sums


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _mismatch(path: Path, expected: str, got: str, what_to_do: str) -> ChecksumMismatch:
    return ChecksumMismatch(f"{path.name}: SHA256 mismatch for {path}\n  expected {expected}\n  got      {got}\n"
                            f"  {what_to_do}")


BAD_CACHE = ("the cached copy is damaged or not the pinned version. "
             "Delete that file and run again to fetch it afresh (it was left in place).")
BAD_MIRROR = (f"the mirror does not hold the pinned file; fix the mirror "
              f"or unset {MIRROR_ENV} to download it instead (nothing was changed).")


def _download(url: str, target: Path, expected: str, progress: bool = True, timeout: float = 30) -> None:
    """Download `url` to `target` through a temporary file; only a verified file is moved into place."""
    from tqdm.auto import tqdm

    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=target.name + ".", suffix=".part", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=target.name, disable=not progress,
                      leave=False) as bar:
                for block in iter(lambda: response.read(1 << 16), b""):
                    out.write(block)
                    bar.update(len(block))
        got = sha256(tmp)
        if got != expected:
            raise _mismatch(target, expected, got, f"the download from {url} is not the pinned file; "
                            "it was discarded (nothing in the cache was changed). Try again later, or use a mirror.")
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)


def _mirror_dir(mirror) -> Path | None:
    mirror = mirror if mirror is not None else os.environ.get(MIRROR_ENV)
    return Path(mirror).expanduser() if mirror else None


def multi30k_file(split: str, lang: str, mirror: str | os.PathLike | None = None,
                  cache_dir: str | os.PathLike | None = None, download: bool = True,
                  progress: bool = True, manifest: Path | None = None, base_url: str = BASE_URL) -> Path:
    """The verified path of one raw Multi30k file (``<split>.<lang>.gz``)."""
    name = file_name(split, lang)
    manifest = manifest if manifest is not None else manifest_path()
    sums = read_manifest(manifest)
    if name not in sums:
        raise ValueError(f"{name} is not listed in the manifest {manifest}")
    expected = sums[name]
    cache = Path(cache_dir) if cache_dir is not None else default_cache()
    cached = cache / name
    if cached.is_file():
        got = sha256(cached)
        if got == expected:
            return cached
        raise _mismatch(cached, expected, got, BAD_CACHE)
    mirror_dir = _mirror_dir(mirror)
    problems = []
    if mirror_dir is not None:
        candidate = mirror_dir / name
        if candidate.is_file():
            got = sha256(candidate)
            if got != expected:
                raise _mismatch(candidate, expected, got, BAD_MIRROR)
            return candidate
        problems.append(f"the mirror {mirror_dir} has no {name}")
    if download:
        url = base_url + name
        try:
            _download(url, cached, expected, progress)
            return cached
        except ChecksumMismatch:
            raise
        except (urllib.error.URLError, OSError, TimeoutError) as err:
            problems.append(f"downloading {url} failed ({getattr(err, 'reason', err)})")
    else:
        problems.append("downloading is switched off")
    raise DataUnavailable(
        f"Multi30k file {name} is not available: " + "; ".join(problems) + ".\n"
        "What to do (any one of these):\n"
        "  * connect to the internet and run again: the files are downloaded once into " f"{cache};\n"
        f"  * or download the task-1 raw files yourself from {BROWSE_URL}\n"
        f"    and put them in {cache};\n"
        f"  * or set {MIRROR_ENV}=/path/to/folder (or pass mirror=...) to a folder that holds them.\n"
        f"Their checksums are in {manifest}.")


NOTEBOOK_SPLITS = ("train", "val", "test_2016_flickr")   # what notebook 06 reads


@dataclass(frozen=True)
class Availability:
    """What `multi30k_availability` found. True when Multi30k can be had; `corpus` is then
    "multi30k", else "toy" (the fallback); `message` is the sentence to show either way."""
    available: bool
    source: str | None   # "cache", "mirror", "download" (or "cache+mirror", ...); None when unavailable
    detail: str          # where the files are, or why they cannot be had
    reason: str = "no mirror, no network"   # in short, why not (when unavailable)

    def __bool__(self) -> bool:
        return self.available

    @property
    def corpus(self) -> str:
        return "multi30k" if self.available else "toy"

    @property
    def message(self) -> str:
        if self.available:
            return f"Multi30k is available ({self.detail})."
        sentences = len(read_lines(toy_dir() / "train.en"))
        return (f"Multi30k is not available here ({self.reason}): the cells below use the "
                f"{sentences}-sentence toy corpus (data/toy/) instead. For the real data, set {MIRROR_ENV} to a "
                f"folder holding the raw Multi30k files (see data/multi30k/README.md), or connect to the "
                f"internet, and run again.\n({self.detail})")


def multi30k_availability(src: str = "en", tgt: str = "de", splits=NOTEBOOK_SPLITS, mirror=None,
                          cache_dir: str | os.PathLike | None = None, download: bool = True,
                          timeout: float = 10, progress: bool = True, manifest: Path | None = None,
                          base_url: str = BASE_URL) -> Availability:
    """Whether the Multi30k files of `splits` x {src, tgt} can be had here, without hanging.

    Each file is looked for, verified, in the cache and then in the mirror (the ``mirror`` argument or
    ``ATTN_MULTI30K_MIRROR``). Missing ones are downloaded into the cache (what the loader would do
    next), each connection allowed `timeout` seconds; the first failed download ends the attempt,
    and the answer is then "not available" (``Availability.corpus == "toy"``), never an exception.

    What is *not* a quiet fallback: a damaged cached file or a mirror file with the wrong checksum
    (`ChecksumMismatch`, as from the loader), and a mirror that was asked for but cannot provide
    the files when downloading fails too (`DataUnavailable`): whoever set a mirror wants the real
    data (CI does), so that is an error to fix, not a reason to train on the toy corpus."""
    sums = read_manifest(manifest)
    cache = Path(cache_dir) if cache_dir is not None else default_cache()
    mirror_dir = _mirror_dir(mirror)
    sources, missing = [], []
    for split in splits:
        for lang in (src, tgt):
            name = file_name(split, lang)
            if name not in sums:
                raise ValueError(f"{name} is not listed in the manifest {manifest}")
            found = None
            for where, folder, advice in (("cache", cache, BAD_CACHE), ("mirror", mirror_dir, BAD_MIRROR)):
                if folder is not None and (folder / name).is_file():
                    got = sha256(folder / name)          # checked as the loader checks it
                    if got != sums[name]:
                        raise _mismatch(folder / name, sums[name], got, advice)
                    found = where
                    break
            if found:
                sources.append(found)
            else:
                missing.append(name)
    problems = []
    if missing and mirror_dir is not None:
        problems.append(f"the mirror {mirror_dir} has no {missing[0]}")
    if missing and download:
        for name in list(missing):
            url = base_url + name
            try:
                _download(url, cache / name, sums[name], progress, timeout=timeout)
            except ChecksumMismatch as err:      # e.g. a captive portal's page: discarded, nothing changed
                problems.append(str(err).splitlines()[0] + f" (from {url})")
                break
            except (urllib.error.URLError, OSError, TimeoutError) as err:
                problems.append(f"downloading {url} failed ({getattr(err, 'reason', err)})")
                break
            missing.remove(name)
            sources.append("download")
    elif missing:
        problems.append("downloading is switched off")
    if missing:
        if mirror_dir is not None:
            raise DataUnavailable(
                f"Multi30k is not available although a mirror was asked for: {'; '.join(problems)}.\n"
                f"Fix the mirror (it must hold {', '.join(missing)}), or unset {MIRROR_ENV} "
                f"to fall back to the toy corpus.")
        return Availability(False, None, "; ".join(problems) + f"; not in the cache {cache}: {', '.join(missing)}",
                            "no mirror, no network" if download else "no mirror, downloading switched off")
    where = "+".join(dict.fromkeys(sources))
    folders = {"cache": str(cache), "mirror": str(mirror_dir), "download": f"downloaded into {cache}"}
    return Availability(True, where, ", ".join(f"{w}: {folders[w]}" for w in dict.fromkeys(sources)))


def read_lines(path: Path) -> list[str]:
    """Sentences of a (possibly gzipped) text file, one per line, trailing whitespace removed."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [line.rstrip("\r\n").strip() for line in fh]


def load_multi30k(split: str, src: str, tgt: str, mirror=None, **kwargs) -> list[tuple[str, str]]:
    """Sentence pairs (source, target) of one Multi30k split, e.g. ``load_multi30k("train", "en", "de")``."""
    if src == tgt:
        raise ValueError("source and target languages must differ")
    a = read_lines(multi30k_file(split, src, mirror, **kwargs))
    b = read_lines(multi30k_file(split, tgt, mirror, **kwargs))
    if len(a) != len(b):
        raise ValueError(f"{split}: {len(a)} {src} lines but {len(b)} {tgt} lines")
    return list(zip(a, b, strict=True))


def load_toy(split: str, src: str, tgt: str, root: Path | None = None) -> list[tuple[str, str]]:
    """The team-written toy corpus (data/toy/<split>.<lang>): short parallel en/de/fr sentences."""
    root = root if root is not None else toy_dir()
    if split not in TOY_SPLITS:
        raise ValueError(f"unknown toy split {split!r}; choose one of {', '.join(TOY_SPLITS)}")
    a, b = read_lines(Path(root) / f"{split}.{src}"), read_lines(Path(root) / f"{split}.{tgt}")
    if len(a) != len(b):
        raise ValueError(f"toy {split}: {len(a)} {src} lines but {len(b)} {tgt} lines")
    return list(zip(a, b, strict=True))


def load_pairs(corpus: str, split: str, src: str, tgt: str, mirror=None) -> list[tuple[str, str]]:
    """`corpus` is "multi30k" or "toy"; the toy corpus names its test split "test"."""
    if corpus == "toy":
        return load_toy("test" if split.startswith("test") else split, src, tgt)
    if corpus == "multi30k":
        return load_multi30k(split, src, tgt, mirror)
    raise ValueError(f"unknown corpus {corpus!r}: 'multi30k' or 'toy'")

