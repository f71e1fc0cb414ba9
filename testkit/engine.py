"""vLLM 0.34.0's real engine (``vllm.LLM``) on a GPU-less machine, one engine per process.

API (tests only; nothing in ``vllm_kimi_ext`` imports this)::

    from testkit.engine import Engine, EngineSpec

    spec = EngineSpec(model="/tmp/tiny-llama", tp=2,
                      speculative_config={"method": "eagle3", "model": "/tmp/eagle3",
                                          "num_speculative_tokens": 3},
                      plugin=True, env={"VLLM_KIMI_EXT_SHARDED_VERIFY": "1"})
    with Engine(spec) as eng:                      # starts a child process, waits for LLM()
        outs = eng.generate([[1, 2, 3], [4, 5]], [{"max_tokens": 40}, {"max_tokens": 70}])
        outs[0].token_ids, outs[0].finish_reason
        eng.spec_metrics()       # the engine's own spec-decode counters (vllm:spec_decode_*)
        eng.rpc("testkit.engine_probes:collective_summary")   # one result per TP rank
        eng.log()                # the child's stdout + stderr so far (vLLM's log lines)

    err = Engine.start_error(spec)   # a spec the engine must refuse: its one-line error

* :class:`EngineSpec` is the whole engine configuration: target directory, TP size,
  ``speculative_config`` (vLLM's dict), plugin on/off (``VLLM_KIMI_EXT=1``), extra
  environment variables (``VLLM_KIMI_EXT_*``, test hooks) and extra ``LLM`` keyword
  arguments. Greedy comparisons build a second spec with ``speculative_config=None``.
* :class:`Engine` runs ``LLM(...)`` in a fresh child process (``python -m
  testkit.engine``, its own session) and talks to it over a local socket, so several
  engines (TP 1 and TP 2, plugin on and off) can run one after another in one pytest
  process and a hung engine is killed with its whole process group. Keep one per test
  module (a module-scoped fixture) so tests share the start-up.
* The environment recipe (:func:`engine_env`): ``VLLM_TARGET_DEVICE=cpu``,
  ``TRITON_INTERPRET=1`` and ``CUDA_VISIBLE_DEVICES`` empty (vLLM then keeps
  ``HAS_TRITON`` with zero drivers and uses Model Runner V2),
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the engine core in the child process);
  TP 1 runs the ``uni`` executor (one process), TP > 1 the ``mp`` executor (one worker
  process per rank, gloo) with ``VLLM_CPU_OMP_THREADS_BIND=nobind``; ``OMP_NUM_THREADS=1``.
  One pre-imported "zygote" process per test session forks the engine children, and TP
  workers are forked from their engine (see "starting children" below): vLLM is imported
  once per session instead of once per process. ``LLM`` arguments:
  ``dtype=float32``, ``enforce_eager``, ``custom_ops: ["none"]``, ``block_size=32`` (the
  CPU_ATTN backend needs a multiple of 32), an explicit ``kv_cache_memory_bytes``.
* Stand-ins in every process: ``testkit/engine_plugin`` holds a ``.dist-info`` directory
  that declares a ``vllm.general_plugins`` entry point (``kimi_ext_testkit =
  testkit.engine_ops:register``). It is put on ``PYTHONPATH`` of the child only, so
  ``importlib.metadata`` finds it there and in every worker vLLM starts (they inherit the
  environment), with nothing installed: a fresh clone runs it. vLLM calls general plugins
  before it builds a worker, so :mod:`testkit.engine_ops` is in place before
  ``CPUWorker`` and the attention backend need it.
* Reading things back from workers: :meth:`Engine.rpc` calls a module-level function
  ``fn(worker, *args)`` on every rank (vLLM's ``collective_rpc``);
  :mod:`testkit.engine_probes` has the common ones (collective counters, sharded-verify
  counters, draft perturbation).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PLUGIN_DIR = Path(__file__).resolve().parent / "engine_plugin"
#: seconds an engine may take to start / to answer one request batch on a loaded 2-core box
START_TIMEOUT = 600.0
CALL_TIMEOUT = 900.0


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    model: str
    tp: int = 1
    speculative_config: dict | None = None
    plugin: bool = False
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    llm_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    max_model_len: int = 512
    max_num_seqs: int = 8
    kv_cache_memory_bytes: int = 32 << 20
    #: start the child with its own interpreter instead of forking the zygote (needed when
    #: ``env`` changes what is imported, e.g. ``PYTHONPATH``)
    fresh_interpreter: bool = False

    def without_speculation(self) -> EngineSpec:
        return dataclasses.replace(self, speculative_config=None)

    def llm_args(self) -> dict[str, Any]:
        args = dict(
            model=str(self.model), skip_tokenizer_init=True, dtype="float32",
            enforce_eager=True, block_size=32, seed=0,
            max_model_len=self.max_model_len, max_num_seqs=self.max_num_seqs,
            kv_cache_memory_bytes=self.kv_cache_memory_bytes,
            tensor_parallel_size=self.tp,
            distributed_executor_backend="uni" if self.tp == 1 else "mp",
            compilation_config={"custom_ops": ["none"]}, disable_log_stats=False,
            speculative_config=self.speculative_config,
        )
        args.update(self.llm_kwargs)
        return args


def _info_or_more_verbose(level: str | None) -> str:
    """The child's vLLM log level: ``DEBUG`` if asked for, else ``INFO``. Engine tests read
    INFO lines from :meth:`Engine.log` (the attention backend, the MoE method), while the
    test process may be quieter: :func:`testkit.vllm_cpu.prepare_process` puts ``WARNING``
    in ``os.environ`` of every process that ran a ``vllm``-tier test, and an engine test
    run after one (``pytest tests/vllm tests/engine``, or a pytest-xdist worker's order)
    would hand it on. A spec's ``env`` still sets any level."""
    return "DEBUG" if (level or "").upper() == "DEBUG" else "INFO"


def engine_env(spec: EngineSpec, base: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment (see the module docstring)."""
    env = dict(os.environ if base is None else base)
    for name in [n for n in env if n.startswith("VLLM_KIMI_EXT")]:
        del env[name]  # only what the spec says
    path = [str(ROOT), str(PLUGIN_DIR)] + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p]
    env.update({
        "PYTHONPATH": os.pathsep.join(path),
        "VLLM_TARGET_DEVICE": "cpu", "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "VLLM_LOGGING_LEVEL": _info_or_more_verbose(env.get("VLLM_LOGGING_LEVEL")),
        "VLLM_NO_USAGE_STATS": "1", "PYTHONUNBUFFERED": "1",
        "KIMI_TESTKIT_WORKER_MP_METHOD": env.get("KIMI_TESTKIT_WORKER_MP_METHOD", "fork"),
    })
    env.pop("VLLM_PLUGINS", None)  # every general plugin: ours and the test kit's
    if spec.plugin:
        env["VLLM_KIMI_EXT"] = "1"
    env.update(spec.env)
    return env


@dataclasses.dataclass(frozen=True)
class Completion:
    token_ids: list[int]
    finish_reason: str | None


class EngineError(RuntimeError):
    """The child raised: ``kind`` is the exception type, ``message`` its ``str()``,
    ``detail`` the traceback and the log tail."""

    def __init__(self, kind: str, message: str, detail: str = ""):
        super().__init__(f"{kind}: {message}\n{detail}")
        self.kind, self.message, self.detail = kind, message, detail

    def lines(self) -> list[str]:
        """The message's lines, stripped, pydantic's ``Value error, `` prefix removed (a
        config refusal reaches ``LLM()`` wrapped in pydantic's ValidationError)."""
        return [ln.strip().removeprefix("Value error, ").split(" [type=")[0]
                for ln in self.message.splitlines() if ln.strip()]


class Engine:
    """One ``vllm.LLM`` in a child process (see the module docstring)."""

    def __init__(self, spec: EngineSpec, *, start_timeout: float = START_TIMEOUT):
        from multiprocessing.connection import Listener

        self.spec = spec
        self._dir = tempfile.TemporaryDirectory(prefix="kimi-engine-")
        self.log_path = Path(self._dir.name) / "engine.log"
        key = secrets.token_bytes(16)
        self._listener = Listener(str(Path(self._dir.name) / "sock"), family="AF_UNIX",
                                  authkey=key)
        (Path(self._dir.name) / "spec.pkl").write_bytes(pickle.dumps((spec, key)))
        env = engine_env(spec)
        (Path(self._dir.name) / "env.pkl").write_bytes(pickle.dumps(env))
        self.log_path.touch()
        self.proc = _launch(self._dir.name, env, fresh=spec.fresh_interpreter)
        self._conn = None
        self.start_seconds = None
        t0 = time.monotonic()
        try:
            self._accept(start_timeout)
            self._call("ready", timeout=start_timeout)
        except BaseException:
            self.close()
            raise
        self.start_seconds = time.monotonic() - t0

    def _accept(self, timeout: float) -> None:
        import socket

        self._listener._listener._socket.settimeout(timeout)
        try:
            self._conn = self._listener.accept()
        except (socket.timeout, OSError):
            code = self.proc.poll()
            raise EngineError("StartFailed", f"engine child did not connect "
                              f"(exit {code})", self.log_tail()) from None

    # ---- calls -------------------------------------------------------------------------
    def _call(self, op: str, timeout: float = CALL_TIMEOUT, **kwargs: Any) -> Any:
        if self._conn is None:
            raise EngineError("Closed", "engine is closed")
        self._conn.send((op, kwargs))
        deadline = time.monotonic() + timeout
        while not self._conn.poll(1.0):
            if self.proc.poll() is not None:
                raise EngineError("ChildExited", f"engine child exited with "
                                  f"{self.proc.returncode} during {op!r}", self.log_tail())
            if time.monotonic() > deadline:
                self.close()
                raise EngineError("Timeout", f"{op!r} took more than {timeout:.0f} s",
                                  self.log_tail())
        status, payload = self._conn.recv()
        if status == "ok":
            return payload
        kind, message, tb = payload
        raise EngineError(kind, message, tb + "\n--- engine log tail ---\n" + self.log_tail())

    def generate(self, prompts: list[list[int]], params: list[dict] | dict) -> list[Completion]:
        """``LLM.generate`` on token-id prompts; ``params``: ``SamplingParams`` keyword
        arguments, one dict per prompt or one for all (``temperature`` defaults to 0)."""
        if isinstance(params, dict):
            params = [params] * len(prompts)
        return [Completion(t, r) for t, r in self._call("generate", prompts=prompts,
                                                        params=params)]

    def spec_metrics(self) -> dict[str, Any]:
        """The engine's spec-decode counters (``LLM.get_metrics``), cumulative:
        ``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens``,
        ``accepted_per_pos`` (list)."""
        return self._call("metrics")

    def rpc(self, fn: str, *args: Any) -> list[Any]:
        """``fn`` (``"module:function"``, called as ``function(worker, *args)``) on every
        TP rank; results by rank."""
        return self._call("rpc", fn=fn, args=args)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-n:])

    # ---- lifetime ----------------------------------------------------------------------
    def close(self, timeout: float = 60.0) -> None:
        if self._conn is not None:
            try:
                self._conn.send(("close", {}))
                self._conn.poll(timeout)
            except (OSError, EOFError):
                pass
            self._conn.close()
            self._conn = None
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._kill_group()
        self._listener.close()

    def _kill_group(self) -> None:
        """The child and every worker it started (same session)."""
        self.proc.kill_group()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @classmethod
    def start_error(cls, spec: EngineSpec) -> EngineError:
        """Start an engine that must refuse to start; its :class:`EngineError` (raises
        AssertionError if it started)."""
        try:
            eng = cls(spec)
        except EngineError as exc:
            return exc
        eng.close()
        raise AssertionError(f"the engine started: {spec}")


# ---- starting children: a pre-imported "zygote" forks them ------------------------------
#
# Importing vLLM costs 10-60 s on a loaded 2-core box, so one process per test session
# (the zygote: ``python -m testkit.engine --zygote``, same environment recipe) imports it
# once and forks one child per engine; TP workers are forked from the child
# (``KIMI_TESTKIT_WORKER_MP_METHOD=fork``, :func:`testkit.engine_ops.keep_worker_fork`).
# Nothing vLLM reads at import time differs
# between engines (the recipe is fixed; ``VLLM_KIMI_EXT*`` are read at call time; general
# plugins load in the child, when ``LLM()`` starts). ``KIMI_TESTKIT_ENGINE_FORK=0`` starts
# each child with a fresh interpreter instead.


class _Child:
    """A started engine child: ``pid``, ``poll()`` (exit status or None),
    ``kill_group()`` (SIGKILL to its session: the child and its workers)."""

    def __init__(self, pid: int, popen: subprocess.Popen | None = None):
        self.pid, self._popen, self.returncode = pid, popen, None

    def poll(self) -> int | None:
        if self._popen is not None:
            self.returncode = self._popen.poll()
            return self.returncode
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            self.returncode = -1
            return self.returncode
        try:  # a zombie (reaped by the zygote soon) counts as exited
            state = Path(f"/proc/{self.pid}/stat").read_text().split(")")[-1].split()[0]
        except OSError:
            state = "X"
        if state in ("Z", "X"):
            self.returncode = -1
        return self.returncode

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)

    def kill_group(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self._popen is not None:
            self._popen.wait()
        else:
            self.wait(10)


_ZYGOTE: dict[str, Any] = {}


def _zygote() -> subprocess.Popen:
    z = _ZYGOTE.get("proc")
    if z is None or z.poll() is not None:
        import atexit

        z = subprocess.Popen([sys.executable, "-m", "testkit.engine", "--zygote"],
                             cwd=str(ROOT), env=engine_env(EngineSpec(model="")),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
        _ZYGOTE["proc"] = z
        atexit.register(_stop_zygote)
        if z.stdout.readline().strip() != "ready":
            raise EngineError("StartFailed", "the engine zygote did not start")
    return z


def _stop_zygote() -> None:
    z = _ZYGOTE.pop("proc", None)
    if z is not None and z.poll() is None:
        try:
            os.killpg(z.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        z.wait()


def _launch(workdir: str, env: dict[str, str], fresh: bool = False) -> _Child:
    if fresh or os.environ.get("KIMI_TESTKIT_ENGINE_FORK", "1") == "0":
        log = open(Path(workdir) / "engine.log", "wb")
        # cwd: the work directory, so ``-m`` puts nothing of ours before PYTHONPATH
        popen = subprocess.Popen([sys.executable, "-m", "testkit.engine", workdir],
                                 cwd=workdir, env=env, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        return _Child(popen.pid, popen)
    z = _zygote()
    z.stdin.write(workdir + "\n")
    z.stdin.flush()
    line = z.stdout.readline().strip()
    if not line.isdigit():
        raise EngineError("StartFailed", f"the engine zygote answered {line!r}")
    return _Child(int(line))


def _zygote_main() -> None:
    """Import vLLM once, then fork one engine child per work directory read from stdin."""
    import vllm  # noqa: F401
    from vllm import LLM, SamplingParams  # noqa: F401

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped automatically
    print("ready", flush=True)
    for line in sys.stdin:
        workdir = line.strip()
        pid = os.fork()
        if pid == 0:
            os.setsid()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            env = pickle.loads((Path(workdir) / "env.pkl").read_bytes())
            os.environ.clear()
            os.environ.update(env)
            fd = os.open(str(Path(workdir) / "engine.log"), os.O_WRONLY | os.O_APPEND)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            try:
                _child(workdir)
            finally:
                os._exit(1)
        print(pid, flush=True)


# ---- the child -----------------------------------------------------------------------------


def _metrics(llm) -> dict[str, Any]:
    out: dict[str, Any] = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
                           "accepted_per_pos": []}
    names = {"vllm:spec_decode_num_drafts": "num_drafts",
             "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens"}
    for m in llm.get_metrics():
        if m.name in names:
            out[names[m.name]] += int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            vals = list(m.values)
            acc = out["accepted_per_pos"]
            out["accepted_per_pos"] = [a + b for a, b in zip(acc + [0] * len(vals), vals)]
    return out


def _resolve(ref: str):
    import importlib

    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def _child(workdir: str) -> None:
    from multiprocessing.connection import Client

    spec, key = pickle.loads((Path(workdir) / "spec.pkl").read_bytes())
    conn = Client(str(Path(workdir) / "sock"), family="AF_UNIX", authkey=key)
    llm = None
    while True:
        try:
            op, kw = conn.recv()
        except EOFError:
            break
        try:
            if op == "ready":
                from vllm import LLM

                llm = LLM(**spec.llm_args())
                result = None
            elif op == "generate":
                from vllm import SamplingParams, TokensPrompt

                sps = [SamplingParams(**{"temperature": 0.0, **p}) for p in kw["params"]]
                outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in kw["prompts"]],
                                    sps, use_tqdm=False)
                result = [(list(o.outputs[0].token_ids), o.outputs[0].finish_reason)
                          for o in outs]
            elif op == "metrics":
                result = _metrics(llm)
            elif op == "rpc":
                result = llm.collective_rpc(_resolve(kw["fn"]), args=tuple(kw["args"]))
            elif op == "close":
                conn.send(("ok", None))
                break
            else:
                raise ValueError(f"unknown op {op!r}")
            conn.send(("ok", result))
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the test
            conn.send(("err", (type(exc).__name__, str(exc).strip(), traceback.format_exc())))
            if op == "ready":
                break
    conn.close()
    if llm is not None:
        del llm
    os._exit(0)  # skip interpreter teardown of vLLM's background threads


if __name__ == "__main__":
    if sys.argv[1] == "--zygote":
        _zygote_main()
    else:
        _child(sys.argv[1])
