"""The Multi30k loader (checksums, cache, mirror, download, the message when nothing works), the
committed manifest and data card, and the team-written toy corpus."""
from __future__ import annotations

import gzip
import hashlib
import os

import pytest

from attention_course import data

MIRROR = os.environ.get(data.MIRROR_ENV)
needs_mirror = pytest.mark.skipif(not MIRROR, reason=f"{data.MIRROR_ENV} is not set (CI sets it to the shared "
                                                     "Multi30k mirror); this test reads the real data")


def _gz(lines: list[str]) -> bytes:
    return gzip.compress("".join(line + "\n" for line in lines).encode(), mtime=0)


@pytest.fixture()
def fake(tmp_path, monkeypatch):
    """A fake upstream: tiny train.en.gz / train.de.gz, their manifest, a mirror, a cache, a 'remote'."""
    files = {"train.en.gz": _gz(["A dog runs.", "Two cats sleep."]),
             "train.de.gz": _gz(["Ein Hund läuft.", "Zwei Katzen schlafen."])}
    manifest = tmp_path / "SHA256SUMS"
    manifest.write_text("".join(f"{hashlib.sha256(b).hexdigest()}  {n}\n" for n, b in files.items()))
    for folder in ("mirror", "remote"):
        (tmp_path / folder).mkdir()
        for name, blob in files.items():
            (tmp_path / folder / name).write_bytes(blob)
    monkeypatch.delenv(data.MIRROR_ENV, raising=False)
    return {"root": tmp_path, "manifest": manifest, "mirror": tmp_path / "mirror", "cache": tmp_path / "cache",
            "remote": (tmp_path / "remote").as_uri() + "/", "files": files}


def _get(fake, **kwargs):
    options = dict(cache_dir=fake["cache"], manifest=fake["manifest"], base_url="file:///nonexistent/", progress=False)
    options.update(kwargs)
    return data.multi30k_file("train", "en", **options)


def test_manifest_parses_and_lists_every_file_the_course_uses():
    sums = data.read_manifest()
    for split in data.SPLITS:
        for lang in data.LANGUAGES:
            assert len(sums[data.file_name(split, lang)]) == 64


def test_mirror_by_argument_and_by_environment(fake, monkeypatch):
    assert _get(fake, mirror=fake["mirror"]) == fake["mirror"] / "train.en.gz"
    monkeypatch.setenv(data.MIRROR_ENV, str(fake["mirror"]))
    path = _get(fake)
    assert path == fake["mirror"] / "train.en.gz"
    assert data.read_lines(path) == ["A dog runs.", "Two cats sleep."]


def test_download_verifies_and_caches(fake):
    path = _get(fake, base_url=fake["remote"])
    assert path == fake["cache"] / "train.en.gz" and path.read_bytes() == fake["files"]["train.en.gz"]
    (fake["root"] / "remote" / "train.en.gz").unlink()          # the cached copy is used from now on
    assert _get(fake, base_url=fake["remote"]) == path


def test_a_bad_download_is_discarded_and_named(fake):
    (fake["root"] / "remote" / "train.en.gz").write_bytes(_gz(["tampered"]))
    with pytest.raises(data.ChecksumMismatch, match=r"train\.en\.gz.*SHA256 mismatch"):
        _get(fake, base_url=fake["remote"])
    assert not fake["cache"].exists() or not list(fake["cache"].iterdir()), "nothing half-downloaded is left behind"


def test_a_bad_mirror_file_is_named_and_not_deleted(fake):
    bad = fake["mirror"] / "train.en.gz"
    bad.write_bytes(b"not the pinned file")
    with pytest.raises(data.ChecksumMismatch) as err:
        _get(fake, mirror=fake["mirror"])
    assert "train.en.gz" in str(err.value) and str(bad) in str(err.value)
    assert bad.read_bytes() == b"not the pinned file", "the loader deletes nothing"


def test_a_damaged_cache_file_is_named_and_kept(fake):
    fake["cache"].mkdir()
    damaged = fake["cache"] / "train.en.gz"
    damaged.write_bytes(b"truncated")
    with pytest.raises(data.ChecksumMismatch, match="Delete that file"):
        _get(fake, mirror=fake["mirror"])
    assert damaged.read_bytes() == b"truncated"


def test_when_nothing_works_the_message_says_what_to_do(fake):
    with pytest.raises(data.DataUnavailable) as err:
        _get(fake, mirror=fake["root"] / "empty-mirror")
    message = str(err.value)
    assert "train.en.gz" in message
    assert data.MIRROR_ENV in message and "github.com/multi30k/dataset" in message
    assert str(fake["cache"]) in message and "connect to the internet" in message
    assert isinstance(err.value, FileNotFoundError)   # the CLI prints it as a one-line error


def test_unknown_split_or_language():
    with pytest.raises(ValueError, match="split"):
        data.file_name("dev", "en")
    with pytest.raises(ValueError, match="language"):
        data.file_name("train", "cs")


def test_data_card_and_manifest_are_committed(repo):
    card = (repo / "data" / "multi30k" / "README.md").read_text()
    for needed in ("non-commercial", "Elliott", "Barrault", data.COMMIT, "SHA256SUMS", data.MIRROR_ENV):
        assert needed in card
    assert (repo / "data" / "multi30k" / "SHA256SUMS").is_file()
    ignored = (repo / ".gitignore").read_text()
    assert "data/cache/" in ignored, "downloads must stay out of git"


@needs_mirror
@pytest.mark.parametrize("tgt", ["de", "fr"])
def test_real_multi30k_splits(tgt):
    sizes = {"train": 29000, "val": 1014, "test_2016_flickr": 1000, "test_2017_flickr": 1000, "test_2017_mscoco": 461}
    for split, n in sizes.items():
        pairs = data.load_multi30k(split, "en", tgt)
        assert len(pairs) == n and all(s and t for s, t in pairs)
    assert data.load_multi30k("train", "en", "de")[0] == (
        "Two young, White males are outside near many bushes.",
        "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.")


def test_toy_corpus(tmp_path, repo):
    for split, n in {"train": 400, "val": 50, "test": 50}.items():
        for src, tgt in [("en", "de"), ("en", "fr"), ("de", "fr")]:
            pairs = data.load_toy(split, src, tgt)
            assert len(pairs) == n
    train = {s for s, _ in data.load_toy("train", "en", "de")}
    assert not train & {s for s, _ in data.load_toy("test", "en", "de")}, "splits are disjoint"
    # the generator reproduces the committed files byte for byte
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_toy", repo / "data" / "toy" / "make_toy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(tmp_path)
    for path in tmp_path.iterdir():
        assert path.read_bytes() == (repo / "data" / "toy" / path.name).read_bytes(), path.name


# --------------------------------------------------------------------------- is Multi30k available? (notebook 06)
def _no_network(calls):
    def download(url, target, expected, progress=True, timeout=30):
        calls.append((url, timeout))
        raise data.urllib.error.URLError("[Errno -2] Name or service not known")
    return download


def test_offline_without_mirror_falls_back_to_the_toy_corpus_and_says_so(tmp_path, monkeypatch):
    monkeypatch.delenv(data.MIRROR_ENV, raising=False)
    calls = []
    monkeypatch.setattr(data, "_download", _no_network(calls))
    found = data.multi30k_availability("en", "de", cache_dir=tmp_path / "empty-cache", progress=False)
    assert not found and found.available is False and found.source is None
    assert found.corpus == "toy"
    assert len(calls) == 1, "the first failed download ends the attempt (no waiting once per file)"
    assert calls[0][0].endswith("train.en.gz") and calls[0][1] <= 10, "a short timeout: offline never hangs"
    message = found.message
    assert message.startswith("Multi30k is not available here (no mirror, no network): the cells below use the "
                              "400-sentence toy corpus")
    assert data.MIRROR_ENV in message and "connect to the internet" in message
    assert "Name or service not known" in message and "train.en.gz" in message     # the detail, for the curious
    # what the notebook then loads: the toy corpus, every split it reads
    assert len(data.load_pairs(found.corpus, "train", "en", "de")) == 400
    assert len(data.load_pairs(found.corpus, "test_2016_flickr", "en", "de")) == 50
    assert not (tmp_path / "empty-cache").exists() or not list((tmp_path / "empty-cache").iterdir())

    off = data.multi30k_availability("en", "de", cache_dir=tmp_path / "empty-cache", download=False)
    assert not off and "downloading switched off" in off.message and len(calls) == 1


def test_available_from_mirror_cache_or_download(fake, monkeypatch):
    """The real downloader is used below, from the fixture's 'remote' folder."""
    only_train = dict(splits=("train",), manifest=fake["manifest"], progress=False, base_url="file:///nonexistent/")
    with monkeypatch.context() as offline:
        offline.setattr(data, "_download", _no_network([]))
        found = data.multi30k_availability("en", "de", mirror=fake["mirror"], cache_dir=fake["cache"], **only_train)
        assert found and found.corpus == "multi30k" and found.source == "mirror"
        assert str(fake["mirror"]) in found.message
        offline.setenv(data.MIRROR_ENV, str(fake["mirror"]))
        assert data.multi30k_availability("en", "de", cache_dir=fake["cache"], **only_train).source == "mirror"

    downloaded = data.multi30k_availability("en", "de", cache_dir=fake["cache"],
                                            **{**only_train, "base_url": fake["remote"]})
    assert downloaded.source == "download" and (fake["cache"] / "train.de.gz").is_file()
    cached = data.multi30k_availability("en", "de", cache_dir=fake["cache"], **only_train)
    assert cached.source == "cache" and cached.corpus == "multi30k"


def test_a_mirror_that_was_asked_for_never_falls_back_quietly(fake, monkeypatch):
    """CI sets the mirror and must train on the real data: a missing or wrong mirror is an error."""
    monkeypatch.setattr(data, "_download", _no_network([]))
    options = dict(splits=("train",), manifest=fake["manifest"], cache_dir=fake["cache"], progress=False)
    with pytest.raises(data.DataUnavailable, match=r"mirror was asked for.*empty-mirror has no train\.en\.gz"):
        data.multi30k_availability("en", "de", mirror=fake["root"] / "empty-mirror", **options)
    (fake["mirror"] / "train.de.gz").write_bytes(b"not the pinned file")
    with pytest.raises(data.ChecksumMismatch, match=r"train\.de\.gz"):
        data.multi30k_availability("en", "de", mirror=fake["mirror"], **options)


def test_a_tampered_download_means_not_available(fake):
    (fake["root"] / "remote" / "train.en.gz").write_bytes(_gz(["a captive portal's login page"]))
    found = data.multi30k_availability("en", "de", splits=("train",), manifest=fake["manifest"],
                                       cache_dir=fake["cache"], base_url=fake["remote"], progress=False)
    assert not found and "SHA256 mismatch" in found.detail
    assert not list(fake["cache"].glob("*.gz")), "nothing unverified is kept"


@needs_mirror
def test_the_ci_mirror_is_available():
    found = data.multi30k_availability("en", "de", download=False)
    assert found and found.corpus == "multi30k" and found.source in {"mirror", "cache", "cache+mirror"}
