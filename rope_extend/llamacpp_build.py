"""A real llama.cpp, built once from the source vendored in a pinned ``llama-cpp-python`` sdist on PyPI.

The sdist contains the whole llama.cpp tree (C++ sources, ``convert_hf_to_gguf.py``, ``gguf-py``), so PyPI is
the only network access needed.  :func:`ensure_llamacpp` downloads it with pip, extracts ``vendor/llama.cpp``,
configures a CPU-only Release build with cmake + ninja and builds only the tools rope-extend uses.  Everything
lives in ``$ROPE_EXTEND_CACHE/llama.cpp-<version>`` (default ``~/.cache/rope-extend/llama.cpp-<version>``):

    llama_cpp_python-<version>.tar.gz   the downloaded sdist
    src/                                vendor/llama.cpp, extracted atomically (temp dir + rename)
    build/                              the cmake/ninja build tree; build.log is the full log
    build/.complete                     JSON stamp written only after every target built and ran

A build is trusted only if its stamp matches the requested targets and options.  An interrupted build has no
stamp and is resumed in place: ninja's log reruns every step that did not finish, and a failure is redone once
from a clean tree before :class:`LlamaCppBuildError` is raised with the last lines of the log.  Concurrent
callers serialise on a lock file.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .demo_model import CACHE_ENV
from .outputs import check_replaceable

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
VENDOR_PREFIX = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
DEFAULT_TARGETS = ("llama-passkey", "llama-perplexity", "llama-tokenize")
NATIVE_ENV = "ROPE_EXTEND_LLAMACPP_NATIVE"  # "0" builds portable binaries (e.g. for a cache shared by CI runners)
LOG_TAIL_LINES = 40


class LlamaCppError(RuntimeError):
    """A llama.cpp tool (perplexity, tokenize, the GGUF converter) failed; the message ends with its output."""


class LlamaCppBuildError(LlamaCppError):
    """Downloading, configuring or building llama.cpp failed; the message ends with the build log's tail."""


@dataclass(frozen=True)
class PasskeyResult:
    """One ``llama-passkey`` run: the key it inserted, the prompt length, its answer and whether it holds the key."""

    key: int
    prompt_tokens: int
    answer: str
    found: bool
    command: str


@dataclass(frozen=True)
class LlamaCpp:
    """A finished llama.cpp build: its source tree (converter, gguf-py) and its binaries."""

    root: Path
    src: Path
    bin_dir: Path

    def tool(self, name: str) -> Path:
        """Path of a built binary, e.g. ``tool("llama-perplexity")``."""
        path = self.bin_dir / name
        if not path.is_file():
            raise FileNotFoundError(f"{path} was not built; pass it in ensure_llamacpp(targets=...)")
        return path

    @property
    def convert_script(self) -> Path:
        return self.src / "convert_hf_to_gguf.py"

    @property
    def gguf_py(self) -> Path:
        """Directory to put on PYTHONPATH so ``convert_hf_to_gguf.py`` imports the matching ``gguf`` package."""
        return self.src / "gguf-py"

    def tokenize(self, model: str | os.PathLike, text_file: str | os.PathLike) -> list[int]:
        """Token ids of a text file exactly as ``llama-perplexity`` tokenises it (BOS per the GGUF, no specials)."""
        proc = _run_tool([str(self.tool("llama-tokenize")), "-m", str(model), "-f", str(text_file), "--ids",
                          "--log-disable"])
        line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("[")), None)
        if line is None:
            raise LlamaCppError(f"llama-tokenize printed no ids:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        return [int(tok) for tok in line.strip("[] \n").split(",") if tok.strip()]

    def perplexity(
        self, model: str | os.PathLike, text_file: str | os.PathLike, ctx: int, *args: str, threads: int | None = None
    ) -> float:
        """``llama-perplexity -c ctx --chunks 1``: perplexity of the second half of the first ctx-token window."""
        cmd = [str(self.tool("llama-perplexity")), "-m", str(model), "-f", str(text_file), "-c", str(ctx),
               "--chunks", "1", "-t", str(threads or os.cpu_count() or 2), *args]
        proc = _run_tool(cmd)
        for line in (proc.stdout + proc.stderr).splitlines():
            if "Final estimate: PPL =" in line:
                return float(line.split("PPL =")[1].split()[0])
        raise LlamaCppError(f"no perplexity in the output of {' '.join(cmd)}:\n{(proc.stdout + proc.stderr)[-3000:]}")

    def passkey(
        self, model: str | os.PathLike, *, junk: int, position: int, group: int = 1, batch: int = 512,
        seed: int = 1234, threads: int | None = None,
    ) -> PasskeyResult:
        """``llama-passkey``: its own repeated-filler prompt with a random 5-digit key after `position` of `junk`
        filler sentences, greedy answer. ``group`` > 1 is llama.cpp's self-extend (``-gan``): before each batch of
        ``batch`` tokens (its neighbour window) the cached positions are shifted and divided by the group size."""
        cmd = [str(self.tool("llama-passkey")), "-m", str(model), "--junk", str(junk), "--pos", str(position),
               "-gan", str(group), "-b", str(batch), "-ub", str(batch), "--seed", str(seed),
               "-t", str(threads or os.cpu_count() or 2)]
        proc = _run_tool(cmd)
        text = proc.stdout + proc.stderr
        key = tokens = None
        for line in text.splitlines():
            if "passkey = " in line and "inserted at position" in line:
                key = int(line.split("passkey = ")[1].split(",")[0])
            if "prompt tokens:" in line:
                tokens = int(line.split("prompt tokens:")[1].split()[0])
        if key is None or tokens is None:
            raise LlamaCppError(f"no passkey result in the output of {' '.join(cmd)}:\n{text[-3000:]}")
        # the answer is printed at output level (stdout); the log (stderr) ends the prompt with its suffix
        answer = proc.stdout.strip()
        if not answer and "The pass key is" in proc.stderr:
            answer = proc.stderr.rsplit("The pass key is", 1)[1]
        answer = answer.split("main: decoded")[0].strip()
        return PasskeyResult(key=key, prompt_tokens=tokens, answer=answer, found=str(key) in answer[:40],
                             command=" ".join(cmd))

    def convert_hf_to_gguf(
        self, model_dir: str | os.PathLike, out: str | os.PathLike, *, outtype: str = "f32", python: str | None = None
    ) -> Path:
        """Run the vendored ``convert_hf_to_gguf.py`` on a Hugging Face folder, writing *out* atomically.

        The converter needs transformers 4.x (it cannot load 5.x-only tokenizer classes) and ``sentencepiece``:
        pass such an interpreter as *python* (default: this one).
        """
        out = Path(out)
        check_replaceable(out, "gguf")  # only a GGUF file is ever replaced
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(self.gguf_py), os.environ.get("PYTHONPATH", "")]))
        cmd = [python or sys.executable, str(self.convert_script), str(model_dir), "--outtype", outtype,
               "--outfile", str(tmp)]
        try:
            _run_tool(cmd, env=env)
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
        return out


def _run_tool(cmd: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        raise LlamaCppError(
            f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    return proc


def default_root() -> Path:
    root = os.environ.get(CACHE_ENV)
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "rope-extend"
    return base / f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}"


def _native() -> bool:
    return os.environ.get(NATIVE_ENV, "1") != "0"


def _cpu_fingerprint() -> str:
    """Native builds are only valid on the CPU they were built for: hash the CPU flags into the stamp."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = line
                break
    except OSError:
        pass
    return hashlib.sha256(f"{platform.machine()} {flags}".encode()).hexdigest()[:16]


# ggml's AMX backend (Q4_0/Q4_1/Q8_0/K-quant weights repacked into AMX tiles) segfaults on some Sapphire-Rapids-class
# machines (ggml-org/llama.cpp#20824, open; stop 27's CI: every Q4_1 run exited -11, F32/F16 ran). A native build
# turns it on wherever the CPU has AMX, so it is compiled out: -march=native's predefined macros are undefined again
# (-U runs after them, where a -mno-amx-* could be re-enabled by the flags -march=native expands to). The rest of the
# native ISA (AVX-512, VNNI) stays, and those weights go through the CPU backend's ordinary kernels.
NO_AMX_FLAGS = "-U__AMX_TILE__ -U__AMX_INT8__ -U__AMX_BF16__"


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def cmake_options(native: bool) -> list[str]:
    no_amx = [f"-DCMAKE_C_FLAGS={NO_AMX_FLAGS}", f"-DCMAKE_CXX_FLAGS={NO_AMX_FLAGS}"] if native and is_x86() else []
    return [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=OFF",  # self-contained binaries, no rpath to get wrong
        f"-DGGML_NATIVE={'ON' if native else 'OFF'}",
        "-DLLAMA_OPENSSL=OFF",  # no HTTPS model download (this llama.cpp replaced LLAMA_CURL with it)
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=ON",  # examples/passkey: llama-passkey (llama.cpp's own self-extend)
        "-DLLAMA_BUILD_SERVER=OFF",
        "-DLLAMA_BUILD_APP=OFF",
        "-DLLAMA_BUILD_TOOLS=ON",
        "-DGGML_CUDA=OFF",
        "-DGGML_METAL=OFF",
        "-DGGML_VULKAN=OFF",
        *no_amx,
    ]


def _stamp(targets: Sequence[str], native: bool) -> dict:
    return {
        "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION,
        "targets": sorted(targets),
        "options": cmake_options(native),
        "cpu": _cpu_fingerprint() if native else "portable",
    }


def _say(progress: Callable[[str], None] | None, message: str) -> None:
    if progress is not None:
        progress(f"[llama.cpp] {message}")


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, errors="replace") as fh:
            return "".join(deque(fh, maxlen=lines))
    except OSError:
        return "(no build log)"


def _run_logged(cmd: list[str], log: Path, progress, *, env: dict | None = None, cwd: Path | None = None) -> None:
    """Run *cmd*, appending its output to *log*; ninja's ``[n/N]`` lines are reported at every 5 %."""
    with open(log, "a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd, bufsize=1
        )
        last_pct = -5
        assert proc.stdout is not None
        for line in proc.stdout:
            fh.write(line)
            if line.startswith("[") and "/" in line.split("]", 1)[0]:
                done, _, total = line[1:].split("]", 1)[0].partition("/")
                if done.strip().isdigit() and total.strip().isdigit() and int(total) > 0:
                    pct = 100 * int(done) // int(total)
                    if pct >= last_pct + 5 or int(done) == int(total):
                        last_pct = pct
                        _say(progress, f"build {done.strip()}/{total.strip()} ({pct}%)")
        rc = proc.wait()
    if rc != 0:
        raise LlamaCppBuildError(
            f"llama.cpp build step failed (exit {rc}): {' '.join(cmd)}\nlast lines of {log}:\n{_tail(log)}"
        )


def _download_sdist(root: Path, log: Path, progress) -> Path:
    sdist = root / SDIST_NAME
    if sdist.is_file() and tarfile.is_tarfile(sdist):
        return sdist
    _say(progress, f"downloading llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} sdist from PyPI")
    tmp = Path(tempfile.mkdtemp(prefix=".sdist-", dir=root))
    try:
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps",
            "--disable-pip-version-check", "--no-binary", ":all:",
            f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", str(tmp),
        ]  # fmt: skip
        try:
            _run_logged(cmd, log, None)
        except LlamaCppBuildError:
            # Newer pips prepare metadata of an sdist, which may need its build backend; the file is there anyway.
            if not (tmp / SDIST_NAME).is_file():
                raise
        os.replace(tmp / SDIST_NAME, sdist)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return sdist


def _extract(sdist: Path, src: Path, progress) -> None:
    if (src / ".complete").is_file():
        return
    _say(progress, f"extracting vendor/llama.cpp into {src}")
    tmp = Path(tempfile.mkdtemp(prefix=".src-", dir=src.parent))
    try:
        with tarfile.open(sdist) as tf:
            members = []
            for m in tf.getmembers():
                if not m.name.startswith(VENDOR_PREFIX) or "/.git/" in m.name:
                    continue
                m.name = m.name[len(VENDOR_PREFIX):]
                members.append(m)
            if not members:
                raise LlamaCppBuildError(f"{sdist} has no {VENDOR_PREFIX}; delete it and retry")
            kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tf.extractall(tmp, members=members, **kwargs)
        (tmp / ".complete").write_text(SDIST_NAME + "\n")
        if src.exists():
            shutil.rmtree(src)
        os.replace(tmp, src)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _build(src: Path, build: Path, targets: Sequence[str], native: bool, log: Path, progress) -> None:
    for exe in ("cmake", "ninja"):
        if shutil.which(exe) is None:
            raise LlamaCppBuildError(f"`{exe}` is not on PATH; install it (e.g. apt-get install cmake ninja-build)")
    build.mkdir(parents=True, exist_ok=True)
    jobs = str(os.cpu_count() or 2)
    env = dict(os.environ, NINJA_STATUS="[%f/%t] ")
    _say(progress, f"configuring ({'native' if native else 'portable'} CPU build) in {build}")
    _run_logged(["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", *cmake_options(native)], log, progress)
    _say(progress, f"building {', '.join(targets)} with {jobs} jobs (~12 CPU-minutes the first time: ~6 min on 2 "
                   "idle cores, longer on a busy machine)")
    _run_logged(["cmake", "--build", str(build), "-j", jobs, "--target", *targets], log, progress, env=env)


def _check_binaries(bin_dir: Path, targets: Sequence[str], log: Path) -> None:
    for name in targets:
        exe = bin_dir / name
        if not exe.is_file():
            raise LlamaCppBuildError(f"{exe} missing after the build\nlast lines of {log}:\n{_tail(log)}")
        proc = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=False, timeout=120)
        if proc.returncode != 0 and "usage" not in (proc.stdout + proc.stderr).lower():
            raise LlamaCppBuildError(
                f"{exe} --help failed (exit {proc.returncode}); a native build copied from another CPU? "
                f"Delete {bin_dir.parent} or set {NATIVE_ENV}=0.\n{(proc.stdout + proc.stderr)[-2000:]}"
            )


def ensure_llamacpp(
    targets: Sequence[str] = DEFAULT_TARGETS,
    *,
    root: str | os.PathLike | None = None,
    progress: Callable[[str], None] | None = _stderr,
) -> LlamaCpp:
    """Return a finished llama.cpp build with *targets*, building it first if needed (see the module docstring)."""
    targets = tuple(sorted(set(targets)))
    root = Path(root).expanduser() if root is not None else default_root()
    root.mkdir(parents=True, exist_ok=True)
    src, build = root / "src", root / "build"
    bin_dir = build / "bin"
    native = _native()
    wanted = _stamp(targets, native)
    stamp_path = build / ".complete"

    def complete() -> bool:
        try:
            stamp = json.loads(stamp_path.read_text())
            same = all(stamp.get(k) == v for k, v in wanted.items() if k != "targets")
            return same and set(targets) <= set(stamp.get("targets", ())) and all(
                (bin_dir / t).is_file() for t in targets)
        except (OSError, ValueError):
            return False

    if complete():
        return LlamaCpp(root, src, bin_dir)
    with open(root / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(progress, f"another process is building; waiting for {root / '.lock'}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if complete():  # another process finished it while we waited
            return LlamaCpp(root, src, bin_dir)
        try:  # keep what an earlier build with the same options built (an incremental build adds targets)
            previous = json.loads(stamp_path.read_text())
            if all(previous.get(k) == v for k, v in wanted.items() if k != "targets"):
                targets = tuple(sorted(set(targets) | set(previous.get("targets", ()))))
                wanted = _stamp(targets, native)
        except (OSError, ValueError):
            pass
        t0 = time.monotonic()
        log = root / "build.log"
        log.write_text(f"# llama.cpp build, llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}, {time.ctime()}\n")
        stamp_path.unlink(missing_ok=True)
        try:
            sdist = _download_sdist(root, log, progress)
            _extract(sdist, src, progress)
            resuming = (build / "CMakeCache.txt").is_file()
            if resuming:
                _say(progress, f"resuming the unfinished build in {build}")
            try:
                _build(src, build, targets, native, log, progress)
            except LlamaCppBuildError:
                if not resuming:
                    raise
                _say(progress, "resumed build failed; redoing it once from a clean build tree")
                shutil.rmtree(build, ignore_errors=True)
                _build(src, build, targets, native, log, progress)
            _check_binaries(bin_dir, targets, log)
        except LlamaCppBuildError:
            raise
        except Exception as exc:  # download/extract/OS errors: same contract, with the log tail
            raise LlamaCppBuildError(f"llama.cpp build failed: {exc!r}\nlast lines of {log}:\n{_tail(log)}") from exc
        stamp_path.write_text(json.dumps({**wanted, "seconds": round(time.monotonic() - t0, 1)}) + "\n")
        _say(progress, f"done in {time.monotonic() - t0:.0f} s: {bin_dir}")
    return LlamaCpp(root, src, bin_dir)


if __name__ == "__main__":  # pragma: no cover - `python -m rope_extend.llamacpp_build` builds (or reuses) it
    lc = ensure_llamacpp(sys.argv[1:] or DEFAULT_TARGETS)
    print(lc.bin_dir)
