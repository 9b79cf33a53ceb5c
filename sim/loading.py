"""The stand-in's start-up: vLLM's load sequence in log lines, with the simulated GPUs filling up.

Phase shares of --load-seconds: start 3 %, weights 70 %, drafter 2 %, compile 8 %, KV cache 4 %,
CUDA graphs 8 %, API start 5 %. Faults that fire during load raise LoadFailed after printing vLLM's
failure lines; the caller exits 1.
"""
from __future__ import annotations

import asyncio
import time

from sim import loadlog, tinylm
from sim.config import SimConfig
from sim.gpu_state import GpuState, write_state
from sim.loadlog import API, ENGINE, WORKER, LogSink
from sim.daemon_thread import in_daemon_thread
from sim.textbackend import Resolved, TextBackendError

CONTEXT_GIB = 0.5  # CUDA context + NCCL buffers before any weight
ACTIVATION_GIB = 3.0  # peak activations vLLM reserves when profiling
DRAFTER_GIB = 1.2
GRAPHS_GIB = 0.52
KV_BYTES_PER_TOKEN = 70272  # MLA latent cache of a 61-layer model, per token per GPU
ROUTES = (("/openapi.json", "HEAD, GET"), ("/docs", "HEAD, GET"), ("/health", "GET"), ("/load", "GET"),
          ("/ping", "GET, POST"), ("/tokenize", "POST"), ("/detokenize", "POST"), ("/v1/models", "GET"),
          ("/version", "GET"), ("/v1/chat/completions", "POST"), ("/v1/chat/completions/render", "POST"),
          ("/v1/completions", "POST"), ("/metrics", "GET"))


class LoadFailed(Exception):
    pass


class Loader:
    def __init__(self, cfg: SimConfig, sink: LogSink, gpus: GpuState,
                 text: "asyncio.Future[Resolved] | None" = None):
        self.cfg = cfg
        self.sink = sink
        self.gpus = gpus
        self.text = text
        self.resolved: Resolved | None = None
        self.total_gib = cfg.gpu_total_mib / 1024
        self.used_gib = 0.0
        self.kv_tokens = 0

    def _mem(self, used_gib: float) -> None:
        self.used_gib = used_gib
        if self.cfg.gpu_state:
            self.gpus.set_memory(used_gib * 1024)
            self.gpus.updated = time.time()
            write_state(self.cfg.gpu_state, self.gpus)

    async def _pause(self, share: float) -> None:
        await asyncio.sleep(self.cfg.load_seconds * share)

    async def run(self) -> None:
        cfg, sink, t = self.cfg, self.sink, self.cfg.traits()
        started = time.monotonic()
        sink.line(API, "api_server.py:1885", f"vLLM server version {cfg.vllm_version}, serving model {cfg.model}")
        args = {"model_tag": cfg.model, "host": cfg.host, "port": cfg.port, "model": cfg.model,
                "trust_remote_code": True, "max_model_len": cfg.max_model_len, "tensor_parallel_size": cfg.gpus}
        if cfg.served_model_name:
            args["served_model_name"] = [cfg.served_model_name]
        if cfg.extract_layers:
            args["speculative_config"] = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                                          "draft_model_config": {"hf_config": {
                                              "eagle_aux_hidden_state_layer_ids": list(cfg.extract_layers)}}}
            args["kv_transfer_config"] = {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                                          "kv_connector_extra_config": {"shared_storage_path": cfg.hs_storage}}
        if cfg.drafter:
            args["speculative_config"] = {"method": "eagle3", "model": cfg.drafter,
                                          "num_speculative_tokens": cfg.num_speculative_tokens}
            if cfg.draft_tensor_parallel_size is not None:
                args["speculative_config"]["draft_tensor_parallel_size"] = cfg.draft_tensor_parallel_size
        sink.line(API, "utils.py:328", f"non-default args: {args}")
        sink.line(API, "model.py:1510", f"Using max model len {cfg.max_model_len}")
        if cfg.config_error:
            loadlog.config_refused(sink, cfg.config_error)
            raise LoadFailed("config")
        await self._pause(0.01)
        spec = (f"SpeculativeConfig(method='eagle3', model='{cfg.drafter}', "
                f"num_spec_tokens={cfg.num_speculative_tokens})" if cfg.drafter else "None")
        sink.line(ENGINE, "core.py:93", f"Initializing a V1 LLM engine (v{cfg.vllm_version}) with config: "
                  f"model='{cfg.model}', speculative_config={spec}, tokenizer='{cfg.model}', "
                  f"dtype=torch.bfloat16, max_seq_len={cfg.max_model_len}, tensor_parallel_size={cfg.gpus}, "
                  f"served_model_name={cfg.served_name}, enable_prefix_caching=True")
        self._mem(CONTEXT_GIB)
        await self._pause(0.01)
        sink.line(WORKER, "parallel_state.py:1208", f"rank 0 in world size {cfg.gpus} is assigned as DP rank 0, "
                  "PP rank 0, TP rank 0, EP rank 0")
        if cfg.faults.nccl_at == 0:
            loadlog.nccl_traceback(sink)
            raise LoadFailed("nccl")
        await self._pause(0.01)
        # the model runner's lines: V1 names the model, V2 names itself first (vLLM 0.16+)
        if t.model_runner == "v2":
            if t.version_tuple >= (0, 16, 0):
                sink.line(WORKER, loadlog.V2_RUNNER, "Using V2 Model Runner")
            sink.line(WORKER, loadlog.V2_SCRATCH, "Loading model from scratch...")
        else:
            sink.line(WORKER, loadlog.V1_START, f"Starting to load model {cfg.model}...")
            if t.version_tuple < (0, 12, 0):  # the V1 runner said both up to 0.11
                sink.line(WORKER, "gpu_model_runner.py:2634", "Loading model from scratch...")
        await self._weights()
        await self._text_backend()
        if cfg.extract_layers:
            self._extraction()
        weights_s = time.monotonic() - started
        sink.line(WORKER, "default_loader.py:267", f"Loading weights took {weights_s:.2f} seconds")
        if cfg.extract_layers:  # the extractor is the runner's drafter, loaded after the target's weights
            self._drafter_start()
            self._aux_line(cfg.extract_layers)
        if cfg.drafter:
            await self._drafter()
        loaded = self.used_gib - CONTEXT_GIB
        sink.line(WORKER, *loadlog.model_loading_took(t, loaded, time.monotonic() - started))
        await self._compile(t.compile_took)
        await self._kv_cache(t.kv_one_line)
        await self._graphs()
        sink.line(ENGINE, "core.py:210", f"init engine (profile, create kv cache, warmup model) took "
                  f"{time.monotonic() - started - weights_s:.2f} seconds")
        await self._pause(0.03)
        url = f"http://{cfg.host}:{cfg.port}"
        sink.line(API, "api_server.py:1898",
                  f"Starting vLLM server on {url}" if t.new_server_line else f"Starting vLLM API server 0 on {url}")
        sink.line(API, "launcher.py:36", "Available routes are:")
        for path, methods in ROUTES:
            sink.line(API, "launcher.py:44", f"Route: {path}, Methods: {methods}")
        await self._pause(0.02)
        sink.uvicorn(f"Started server process [{sink.pids[API]}]")
        sink.uvicorn("Waiting for application startup.")
        sink.uvicorn("Application startup complete.")

    async def _text_backend(self) -> None:
        """Wait for the text backend (the tiny model's first build can outlast the simulated load) and
        say which one serves: the only SIMULATED line in the log, after the weights bar so no other
        line lands inside it."""
        if self.text is None:
            return
        if not self.text.done():
            where = tinylm.model_dir()
            what = (f"loading it from {where}" if (where / "config.json").is_file() else
                    f"first use: building it in {where}, about 15 s on a small CPU")
            self.sink.line(WORKER, "sim_text.py:1", f"SIMULATED text backend: waiting for the tiny verifier ({what})")
        try:
            self.resolved = await self.text
        except Exception as exc:  # an explicit tinylm that cannot run, or a broken build
            why = str(exc) if isinstance(exc, TextBackendError) else f"{type(exc).__name__}: {exc}"
            self.sink.line(WORKER, "sim_text.py:1", f"SIMULATED text backend failed: {why}", "ERROR")
            self.sink.line(ENGINE, "core.py:708", "EngineCore failed to start.", "ERROR")
            loadlog.engine_init_failed(self.sink)
            raise LoadFailed("text backend") from None
        self.sink.line(WORKER, "sim_text.py:1", self.resolved.log_line())

    async def _drafter(self) -> None:
        """vLLM's drafter lines. A checkpoint is loaded for real (sim/specdec.py) and decodes with the tiny
        verifier; a path with nothing behind it gets the SIMULATED drafter, which says so."""
        cfg, sink = self.cfg, self.sink
        self._drafter_start()
        if cfg.drafter_mode == "simulated":
            rates = ", ".join(f"{r:g}" for r in (cfg.synthetic_rates or cfg.acceptance))
            sink.line(WORKER, "sim_text.py:1", f"SIMULATED drafter: nothing at {cfg.drafter}; acceptance is made up "
                      f"(per position {rates}), no draft model runs", "WARNING")
            await self._pause(0.02)
            aux = cfg.aux_layers
        else:
            aux = await self._real_drafter()
        self._aux_line(aux)
        self._mem(self.used_gib + DRAFTER_GIB)

    def _drafter_start(self) -> None:
        """The V1 runner announces its drafter (the extractor counts as one); the V2 runner says nothing."""
        if self.cfg.traits().model_runner == "v1":
            self.sink.line(WORKER, loadlog.V1_DRAFTER, "Loading drafter model...")

    def _aux_line(self, layer_ids: tuple[int, ...]) -> None:
        line = loadlog.aux_layers_line(self.cfg.traits(), tuple(layer_ids))
        if line is not None:
            self.sink.line(WORKER, *line)

    async def _real_drafter(self) -> tuple[int, ...]:
        from sim.specdec import DrafterError, Eagle3Drafter, conditional_rates

        cfg, sink = self.cfg, self.sink
        text = self.resolved.backend if self.resolved else None
        try:
            if getattr(text, "name", None) != "tinylm":
                raise DrafterError(f"the EAGLE-3 checkpoint {cfg.drafter} needs the tiny verifier to draft for "
                                   f"(--text-backend tinylm); the {getattr(text, 'name', 'canned')} text has no "
                                   f"hidden states")
            drafter = await in_daemon_thread(
                lambda: Eagle3Drafter.load(cfg.drafter, text.model_dir, text.model.config), "drafter-load")
        except Exception as exc:  # a bad checkpoint is vLLM's engine failing to start, with the reason
            why = str(exc) if isinstance(exc, DrafterError) else f"{type(exc).__name__}: {exc}"
            sink.line(WORKER, "eagle.py:1080", f"Failed to load the drafter: {why}", "ERROR")
            sink.line(ENGINE, "core.py:708", "EngineCore failed to start.", "ERROR")
            loadlog.engine_init_failed(sink)
            raise LoadFailed("drafter") from None
        text.use_drafter(drafter, cfg.num_speculative_tokens,
                         synthetic=conditional_rates(cfg.synthetic_rates) if cfg.synthetic_rates else None)
        sink.line(WORKER, "sim_text.py:1", f"SIMULATED GPUs: the EAGLE-3 drafter decodes for real on CPU with the "
                  f"tiny verifier ({cfg.num_speculative_tokens} speculative tokens per step)")
        return drafter.aux_layer_ids

    def _extraction(self) -> None:
        """extract_hidden_states: the connector's start-up lines, or vLLM's failure when the model cannot
        give the asked layers (the stand-in's model is the text backend's)."""
        from sim.extraction import startup_problem

        problem = startup_problem(self.cfg, self.resolved.backend if self.resolved else None)
        if problem:
            self.sink.line(WORKER, "extract_hidden_states.py:88", problem, "ERROR")
            self.sink.line(ENGINE, "core.py:708", "EngineCore failed to start.", "ERROR")
            loadlog.engine_init_failed(self.sink)
            raise LoadFailed("extraction")
        self.sink.line(WORKER, "example_hidden_states_connector.py:178",
                       f"Shared storage path is {self.cfg.hs_storage}")

    async def _weights(self) -> None:
        cfg, sink = self.cfg, self.sink
        total = cfg.shards
        fits = cfg.gpu_memory_utilization * self.total_gib - CONTEXT_GIB
        # weights that do not fit run out of memory part-way, like a too-small tensor-parallel size
        oom_at = fits / cfg.weights_gib if cfg.weights_gib > fits else None
        crash_at = min(x for x in (cfg.faults.crash_at, oom_at, 2.0) if x is not None)
        nccl_at = cfg.faults.nccl_at if cfg.faults.nccl_at else None
        step = cfg.load_seconds * 0.70 / total
        began = time.monotonic()
        sink.write(sink.prefix(WORKER))
        for done in range(total + 1):
            if done:
                await asyncio.sleep(step)
            sink.write("\r" + loadlog.shard_bar(done, total, time.monotonic() - began))
            self._mem(CONTEXT_GIB + cfg.weights_gib * done / total)
            if done < total and done / total >= crash_at:
                sink.write("\n")
                loadlog.oom_traceback(sink, self.total_gib, self.used_gib)
                raise LoadFailed("oom")
            if nccl_at is not None and done < total and done / total >= nccl_at:
                sink.write("\n")
                loadlog.nccl_traceback(sink)
                raise LoadFailed("nccl")
        sink.write("\n")

    async def _compile(self, took: bool) -> None:
        sink, share = self.sink, 0.08
        sink.line(WORKER, "backends.py:548", "Using cache directory: /root/.cache/vllm/torch_compile_cache/"
                  "5f0c2a1e/rank_0_0/backbone for vLLM's torch.compile")
        await self._pause(share * 0.4)
        dynamo = self.cfg.load_seconds * share * 0.4
        sink.line(WORKER, "backends.py:559", f"Dynamo bytecode transform time: {dynamo:.2f} s")
        await self._pause(share * 0.6)
        total = self.cfg.load_seconds * share
        sink.line(WORKER, "monitor.py:34", f"torch.compile {'took' if took else 'takes'} {total:.2f} s in total")
        self._mem(self.used_gib + 0.3)

    async def _kv_cache(self, one_line: bool) -> None:
        cfg, sink = self.cfg, self.sink
        await self._pause(0.04)
        kv_gib = max(0.0, cfg.gpu_memory_utilization * self.total_gib - self.used_gib - ACTIVATION_GIB)
        sink.line(WORKER, "gpu_worker.py:298", f"Available KV cache memory: {kv_gib:.2f} GiB")
        self.kv_tokens = int(kv_gib * 2**30 / KV_BYTES_PER_TOKEN)
        conc = self.kv_tokens / cfg.max_model_len
        size = f"GPU KV cache size: {self.kv_tokens:,} tokens"
        maxc = f"Maximum concurrency for {cfg.max_model_len:,} tokens per request: {conc:.2f}x"
        if one_line:
            sink.line(ENGINE, "kv_cache_utils.py:1087", f"{size}, {maxc}")
        else:
            sink.line(ENGINE, "kv_cache_utils.py:1087", size)
            sink.line(ENGINE, "kv_cache_utils.py:1091", maxc)
        self._mem(self.used_gib + kv_gib)

    async def _graphs(self) -> None:
        sink = self.sink
        began = time.monotonic()
        for desc, total, share in (("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)", 67, 0.05),
                                   ("Capturing CUDA graphs (decode, FULL)", 35, 0.03)):
            sink.write(sink.prefix(WORKER))
            t0 = time.monotonic()
            steps = 10  # redraws: enough to look alive, few enough to stay cheap
            for i in range(steps + 1):
                if i:
                    await self._pause(share / steps)
                sink.write("\r" + loadlog.graph_bar(desc, total * i // steps, total, time.monotonic() - t0))
            sink.write("\n")
        self._mem(self.used_gib + GRAPHS_GIB)
        secs = max(1, round(time.monotonic() - began))
        sink.line(WORKER, "gpu_model_runner.py:3480", f"Graph capturing finished in {secs:.0f} secs, "
                  f"took {GRAPHS_GIB:.2f} GiB")
