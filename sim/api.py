"""The stand-in's HTTP surface (aiohttp.web), shaped like vLLM's OpenAI server; see vllm-surface.md.

Simulated-only extras: `GET/POST /_sim/fault` (see faults.py) and `GET /_sim/info` (which text backend
serves: {"simulated": true, "text_backend": "canned"|"tinylm", "model_dir": path or null, ...}). Everything here is cheap on purpose: a
benchmark pushes tens of thousands of long completions through it at high concurrency.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import time
import uuid
from typing import Any, Awaitable, Callable

from aiohttp import web

from sim import chat, loadlog
from sim.config import SimConfig
from sim.extraction import HiddenStatesWriter
from sim.faults import FaultError
from sim.loadlog import LogSink
from sim.metrics import RequestSpec, ServerMetrics
from sim.textbackend import CannedText, Resolved
from sim.tinylm_text import SamplingError, sampling_from


class ApiError(Exception):
    def __init__(self, status: int, err_type: str, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.err_type, self.param = status, err_type, param


class SimApi:
    def __init__(self, cfg: SimConfig, sink: LogSink, kv_tokens: int, text: Resolved | None = None):
        self.cfg = cfg
        self.resolved = text or Resolved(CannedText(cfg.response_tokens), "canned", "")
        self.text = self.resolved.backend
        # a real model cannot go past its trained context, whatever --max-model-len says (vLLM would
        # refuse to start; the stand-in serves, and reports, the smaller limit)
        self.context_limit = min(cfg.max_model_len, self.text.max_model_len or cfg.max_model_len)
        self.traits = cfg.traits()
        self.sink = sink
        self.faults = cfg.faults
        self.metrics = ServerMetrics(cfg.served_name, num_spec_tokens=cfg.num_speculative_tokens if cfg.drafter else 0,
                                     old_cache_gauge=self.traits.old_cache_gauge)
        # a backend that generates step by step (tinylm) is served live: each step's tokens are streamed as
        # they come and timed for real; canned text is served whole after the simulated latencies
        self.live = bool(getattr(self.text, "live", False))
        # made-up acceptance only for the SIMULATED drafter (a path with no checkpoint behind it): its
        # --acceptance rates, or those vLLM's synthetic sampler was set to (a real checkpoint with the
        # synthetic sampler decodes for real and accepts by the set rates: sim/specdec.accept_synthetic)
        self.made_up_acceptance = (cfg.synthetic_rates or cfg.acceptance) if cfg.drafter_mode == "simulated" else ()
        # the answer's own made-up rates (--answer-acceptance; vLLM's synthetic sampler has one set for all)
        self.made_up_answer = (cfg.answer_acceptance if cfg.drafter_mode == "simulated" and not cfg.synthetic_rates
                               else None)
        self.kv_tokens = max(1, kv_tokens)
        self.slots = asyncio.Semaphore(cfg.max_num_seqs)
        self.running = self.waiting = 0
        self.inflight_tokens = 0
        self.answered = 0
        self.on_die: Callable[[], None] = lambda: os._exit(1)
        # the engine died and the server is to shut itself down (the CPU attention's refusal): Server sets it
        self.on_engine_dead: Callable[[], None] = lambda: None
        # extraction mode: every generation also writes the prompt's hidden states (sim/extraction.py)
        self.extractor = HiddenStatesWriter(cfg, self.text, sink) if cfg.extract_layers else None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20,
                              middlewares=[self._access_log] if self.cfg.access_log else [])
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/ping", self.health)
        r.add_post("/ping", self.health)
        r.add_get("/version", lambda _: web.json_response({"version": self.cfg.vllm_version}))
        r.add_get("/load", lambda _: web.json_response({"server_load": self.running + self.waiting}))
        r.add_get("/v1/models", self.models)
        r.add_get("/metrics", self.metrics_page)
        r.add_post("/v1/chat/completions", self._guard(self.chat_completions))
        r.add_post("/v1/chat/completions/render", self._guard(self.render))
        r.add_post("/v1/completions", self._guard(self.completions))
        r.add_post("/tokenize", self._guard(self.tokenize))
        r.add_get("/_sim/fault", self.fault_get)
        r.add_post("/_sim/fault", self.fault_post)
        r.add_get("/_sim/info", lambda _: web.json_response(self.resolved.info()))
        return app

    @web.middleware
    async def _access_log(self, request: web.Request, handler: Any) -> web.StreamResponse:
        resp = await handler(request)
        peer = request.transport.get_extra_info("peername") if request.transport else None
        who = f"{peer[0]}:{peer[1]}" if peer else "-"
        self.sink.uvicorn(f'{who} - "{request.method} {request.path_qs} HTTP/{request.version.major}.'
                          f'{request.version.minor}" {resp.status} {resp.reason}')
        return resp

    # ---- small endpoints -------------------------------------------------------------------------
    async def health(self, _: web.Request) -> web.Response:
        return web.Response(status=503 if self.faults.engine_dead else 200)

    async def models(self, _: web.Request) -> web.Response:
        card = {"id": self.cfg.served_name, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                "root": self.cfg.model, "parent": None, "max_model_len": self.context_limit,
                "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                                "created": int(time.time()), "allow_create_engine": False,
                                "allow_sampling": True, "allow_logprobs": True, "allow_search_indices": False,
                                "allow_view": True, "allow_fine_tuning": False, "organization": "*",
                                "group": None, "is_blocking": False}]}
        return web.json_response({"object": "list", "data": [card]})

    async def metrics_page(self, _: web.Request) -> web.Response:
        self.metrics.running.set(float("inf") if self.faults.inf_metrics else self.running)
        self.metrics.waiting.set(self.waiting)
        self.metrics.set_kv_usage(min(1.0, self.inflight_tokens / self.kv_tokens))
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8")

    async def fault_get(self, _: web.Request) -> web.Response:
        return web.json_response({"simulated": True, "faults": self.faults.describe()})

    async def fault_post(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            if not isinstance(body, dict) or not isinstance(body.get("kind"), str):
                raise FaultError('body must be JSON like {"kind": "5xx", "value": 3}')
            self.faults.apply(body["kind"], body.get("value"))
        except (ValueError, FaultError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"simulated": True, "faults": self.faults.describe()})

    # ---- helpers ---------------------------------------------------------------------------------
    def _error(self, status: int, err_type: str, message: str, param: str | None = None) -> web.Response:
        body = chat.error_body(message, err_type, status, nested=self.traits.nested_errors, param=param)
        return web.json_response(body, status=status)

    def _guard(self, handler: Callable[[web.Request, dict[str, Any]], Awaitable[web.StreamResponse]]):
        async def wrapped(request: web.Request) -> web.StreamResponse:
            try:
                try:
                    body = await request.json()
                except ValueError as exc:
                    raise ApiError(400, "BadRequestError", f"request body is not valid JSON: {exc}") from None
                if not isinstance(body, dict):
                    raise ApiError(400, "BadRequestError", "request body must be a JSON object")
                return await handler(request, body)
            except ApiError as exc:
                return self._error(exc.status, exc.err_type, str(exc), exc.param)
        return wrapped

    def _check_model(self, body: dict[str, Any]) -> str:
        model = body.get("model")
        if model is None:
            return self.cfg.served_name
        if model != self.cfg.served_name:
            raise ApiError(404, "NotFoundError", f"The model `{model}` does not exist.", "model")
        return model

    def _max_tokens(self, body: dict[str, Any], prompt_len: int, default: int | None, *, prompt: str) -> int:
        """The request's completion budget, or the 400 vLLM gives a request that does not fit the context
        (worded as the simulated version words it, see versions.py). `prompt`: "chat" (rendered messages),
        "text" (a completion's string) or "ids" (given token ids, never cut)."""
        limit = self.context_limit
        param = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        raw = body.get(param)
        if raw is not None and (not isinstance(raw, int) or isinstance(raw, bool) or raw < 1):
            raise ApiError(400, "BadRequestError", f"max_tokens must be an integer >= 1, got {raw!r}", "max_tokens")
        style = self.traits.context_errors
        if style == "0.11":
            if prompt_len >= limit:
                raise ApiError(400, "BadRequestError", f"This model's maximum context length is {limit} tokens. "
                               f"However, your request has {prompt_len} input tokens. Please reduce the length of "
                               "the input messages.")
            if raw is not None and prompt_len + raw > limit:
                raise ApiError(400, "BadRequestError", f"'max_tokens' or 'max_completion_tokens' is too large: {raw}. "
                               f"This model's maximum context length is {limit} tokens and your request has "
                               f"{prompt_len} input tokens ({raw} > {limit} - {prompt_len}).")
        else:
            if raw is not None and raw > limit:
                raise ApiError(400, "BadRequestError", f"{param}={raw} cannot be greater than max_model_len="
                               f"max_total_tokens={limit}. Please request fewer output tokens. "
                               f"(parameter={param}, value={raw})", param)
            wanted = raw if raw is not None else (default or 0)
            room = limit - wanted  # the renderer's max_input_tokens
            if prompt_len > room or prompt_len >= limit:
                # the renderer tokenizes text only up to room + 1: past that it cannot say how long it is
                cut = prompt != "ids" and (style == "renderer" or prompt == "text")
                shown = min(prompt_len, room + 1) if cut else prompt_len
                if style == "renderer":
                    message = (f"You passed {shown} input tokens and requested {wanted} output tokens. However, "
                               f"the model's context length is only {limit} tokens, resulting in a maximum input "
                               f"length of {room} tokens. Please reduce the length of the input prompt.")
                else:
                    least = "at least " if shown < prompt_len else ""
                    message = (f"This model's maximum context length is {limit} tokens. However, you requested "
                               f"{wanted} output tokens and your prompt contains {least}{shown} input tokens, for "
                               f"a total of {least}{shown + wanted} tokens. Please reduce the length of the input "
                               f"prompt or the number of requested output tokens.")
                raise ApiError(400, "BadRequestError", f"{message} (parameter=input_tokens, value={shown})",
                               "input_tokens")
        if raw is None:
            return default if default is not None else limit - prompt_len
        return raw

    def _sampling(self, body: dict[str, Any]) -> Any:
        try:
            return sampling_from(body)
        except SamplingError as exc:
            raise ApiError(400, "BadRequestError", str(exc), exc.param) from None

    async def _before_generation(self) -> None:
        f = self.faults
        if f.error_burst > 0:
            f.error_burst -= 1
            raise ApiError(500, "InternalServerError", "Simulated internal server error (5xx fault).")
        if self.cfg.attention_error and not f.engine_dead:
            # vLLM's CPU build starts with a head size its kernel lacks and dies at the first step
            f.engine_dead = True
            loadlog.cpu_attention_death(self.sink, self.cfg.attention_error)
            self.on_engine_dead()
        if f.engine_dead:
            raise ApiError(500, "InternalServerError",
                           "EngineCore encountered an issue. See stack trace (above) for the root cause.")
        if f.stall:
            await asyncio.Event().wait()  # accepted, never answered (until the client gives up)

    def _after_generation(self) -> None:
        self.answered += 1
        f = self.faults
        if f.engine_dead_after is not None and not f.engine_dead and self.answered >= f.engine_dead_after:
            f.engine_dead = True
            loadlog.engine_fatal(self.sink)

    def _dies_now(self) -> bool:
        return self.faults.die_after is not None and self.answered >= self.faults.die_after

    def _die(self) -> None:
        loadlog.engine_fatal(self.sink)
        self.on_die()

    # ---- generation ------------------------------------------------------------------------------
    def _chat_prompt(self, body: dict[str, Any], *, generation_prompt: bool = True
                     ) -> tuple[list[dict[str, Any]], bool, list[int]]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise ApiError(400, "BadRequestError", "messages must be a non-empty list of message objects", "messages")
        kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict):
            raise ApiError(400, "BadRequestError", "chat_template_kwargs must be an object", "chat_template_kwargs")
        thinking = bool(kwargs.get("thinking", kwargs.get("enable_thinking", True)))
        try:
            prompt_ids = self.text.chat_prompt(messages, thinking=thinking, add_generation_prompt=generation_prompt)
        except ValueError as exc:
            raise ApiError(400, "BadRequestError", str(exc), "messages") from None
        return messages, thinking, prompt_ids

    @staticmethod
    def _generation_prompt(body: dict[str, Any]) -> bool:
        add = body.get("add_generation_prompt", True)
        if not isinstance(add, bool):
            raise ApiError(400, "BadRequestError", "add_generation_prompt must be a boolean", "add_generation_prompt")
        return add

    def _truncate(self, ids: list[int], body: dict[str, Any]) -> list[int]:
        """vLLM's `truncate_prompt_tokens` (-1: the model's length) and `truncation_side` (default left:
        keep the last tokens; speculators asks for right, keeping the start)."""
        limit, side = body.get("truncate_prompt_tokens"), body.get("truncation_side") or "left"
        if limit is None:
            return ids
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < -1:
            raise ApiError(400, "BadRequestError", f"truncate_prompt_tokens must be an integer >= -1, got {limit!r}",
                           "truncate_prompt_tokens")
        if side not in ("left", "right"):
            raise ApiError(400, "BadRequestError", f"truncation_side must be 'left' or 'right', got {side!r}",
                           "truncation_side")
        if limit > self.context_limit:
            raise ApiError(400, "BadRequestError", f"truncate_prompt_tokens value ({limit}) is greater than "
                           f"max_model_len ({self.context_limit}). Please request a smaller truncation size.",
                           "truncate_prompt_tokens")
        keep = self.context_limit if limit == -1 else limit
        if len(ids) <= keep:
            return ids
        return ids[:keep] if side == "right" else ids[len(ids) - keep:]

    async def render(self, _: web.Request, body: dict[str, Any]) -> web.Response:
        """`POST /v1/chat/completions/render`: the request as vLLM would hand it to the engine, a
        GenerateRequest (vllm/entrypoints/serve/disagg/protocol.py): the prompt's token ids and the
        sampling parameters; nothing is generated."""
        self._check_model(body)
        ids = self._truncate(self._chat_prompt(body, generation_prompt=self._generation_prompt(body))[2], body)
        raw = body.get("max_completion_tokens", body.get("max_tokens"))
        sampling = self._sampling(body)
        params = {"n": 1, "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
                  "seed": sampling.seed, "max_tokens": raw if isinstance(raw, int) and raw > 0 else
                  max(0, self.context_limit - len(ids)), "stop": [], "stop_token_ids": [],
                  "skip_special_tokens": True, "spaces_between_special_tokens": True}
        return web.json_response({"request_id": f"chatcmpl-{uuid.uuid4().hex}", "token_ids": ids, "features": None,
                                  "sampling_params": params, "model": body.get("model"), "stream": False,
                                  "stream_options": None, "cache_salt": None, "priority": 0,
                                  "kv_transfer_params": None})

    async def tokenize(self, _: web.Request, body: dict[str, Any]) -> web.Response:
        if self.faults.no_tokenize:
            return web.json_response({"detail": "Not Found"}, status=404)  # FastAPI's answer for no route
        self._check_model(body)
        if "messages" in body:
            ids = self._chat_prompt(body)[2]
        elif isinstance(body.get("prompt"), str):
            ids = self.text.encode(body["prompt"])
        else:
            raise ApiError(400, "BadRequestError", "give either prompt (string) or messages", "prompt")
        return web.json_response({"count": len(ids), "max_model_len": self.context_limit, "tokens": ids,
                                  "token_strs": None})

    async def chat_completions(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        model = self._check_model(body)
        if body.get("n", 1) != 1:
            raise ApiError(400, "BadRequestError", "the stand-in supports only n=1", "n")
        messages, thinking, prompt_ids = self._chat_prompt(body, generation_prompt=self._generation_prompt(body))
        max_tokens = self._max_tokens(body, len(prompt_ids), None, prompt="chat")
        sampling = self._sampling(body)
        await self._before_generation()
        with_ids = bool(body.get("return_token_ids"))
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        detail = self.traits.reasoning_tokens_detail
        if body.get("stream"):
            enc = chat.ChunkEncoder(request_id=rid, created=created, model=model, obj="chat.completion.chunk",
                                    reasoning_keys=self.traits.reasoning_keys, token_ids=with_ids)
            opts = body.get("stream_options") or {}
            want_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
            if self.live:
                return await self._live_stream(request, enc, prompt_ids, thinking, max_tokens, sampling,
                                               prompt_ids if with_ids else None, want_usage, detail, enc.delta)
            out = await self.text.chat(messages, prompt_ids, thinking=thinking, max_tokens=max_tokens,
                                       sampling=sampling)
            usage = chat.usage(len(prompt_ids), out, reasoning_detail=detail)
            return await self._stream(request, enc, out, len(prompt_ids), prompt_ids if with_ids else None,
                                      usage if want_usage else None, enc.delta)
        if self.live:
            out = await self._generate_live(prompt_ids, thinking, max_tokens, sampling)
        else:
            out = await self.text.chat(messages, prompt_ids, thinking=thinking, max_tokens=max_tokens,
                                       sampling=sampling)
        usage = chat.usage(len(prompt_ids), out, reasoning_detail=detail)
        choice: dict[str, Any] = {"index": 0, "message": chat.message(out, self.traits.reasoning_keys),
                                  "logprobs": None, "finish_reason": out.finish_reason, "stop_reason": None}
        resp: dict[str, Any] = {"id": rid, "object": "chat.completion", "created": created, "model": model,
                                "choices": [choice], "usage": usage, "prompt_logprobs": None,
                                "kv_transfer_params": await self._hidden_states(rid, prompt_ids, body)}
        if with_ids:
            choice["token_ids"] = out.ids
            resp["prompt_token_ids"] = prompt_ids
        if not self.live:
            await self._run(len(prompt_ids), out)
        return web.json_response(resp)

    async def completions(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        model = self._check_model(body)
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompt_ids = self.text.encode(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(i, int) and not isinstance(i, bool)
                                                         for i in prompt):
            bad = [i for i in prompt if not 0 <= i < self.text.vocab_size]
            if bad:
                raise ApiError(400, "BadRequestError", f"token id {bad[0]} is out of vocabulary "
                               f"(0..{self.text.vocab_size - 1})", "prompt")
            prompt_ids = list(prompt)
        else:
            raise ApiError(400, "BadRequestError", "prompt must be a string or a non-empty list of token ids "
                           "(batched prompts are not supported by the stand-in)", "prompt")
        # vLLM's default for /v1/completions; a text prompt is cut at the room like a chat one, ids are not
        max_tokens = self._max_tokens(body, len(prompt_ids), 16,
                                      prompt="text" if isinstance(prompt, str) else "ids")
        sampling = self._sampling(body)
        await self._before_generation()
        with_ids = bool(body.get("return_token_ids"))
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        if body.get("stream"):
            enc = chat.ChunkEncoder(request_id=rid, created=created, model=model, obj="text_completion",
                                    reasoning_keys=(), token_ids=with_ids)
            opts = body.get("stream_options") or {}
            want_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
            if self.live:
                return await self._live_stream(request, enc, prompt_ids, False, max_tokens, sampling, None,
                                               want_usage, False, enc.text_delta)
            out = await self.text.complete(prompt_ids, max_tokens=max_tokens, sampling=sampling)
            usage = chat.usage(len(prompt_ids), out, reasoning_detail=False)
            return await self._stream(request, enc, out, len(prompt_ids), None, usage if want_usage else None,
                                      enc.text_delta)
        if self.live:
            out = await self._generate_live(prompt_ids, False, max_tokens, sampling)
        else:
            out = await self.text.complete(prompt_ids, max_tokens=max_tokens, sampling=sampling)
        usage = chat.usage(len(prompt_ids), out, reasoning_detail=False)
        choice: dict[str, Any] = {"index": 0, "text": "".join(out.pieces), "logprobs": None,
                                  "finish_reason": out.finish_reason, "stop_reason": None, "prompt_logprobs": None}
        resp: dict[str, Any] = {"id": rid, "object": "text_completion", "created": created, "model": model,
                                "choices": [choice], "usage": usage,
                                "kv_transfer_params": await self._hidden_states(f"{rid}-0", prompt_ids, body)}
        if with_ids:
            choice["token_ids"] = out.ids
            choice["prompt_token_ids"] = prompt_ids
        if not self.live:
            await self._run(len(prompt_ids), out)
        return web.json_response(resp)

    # ---- live generation (a step-by-step backend) ------------------------------------------------
    async def _generate_live(self, prompt_ids: list[int], thinking: bool, max_tokens: int, sampling: Any,
                             emit: Callable[[chat.Output, int, int, bool], Awaitable[None]] | None = None
                             ) -> chat.Output:
        """Generate under a batch slot, handing each step's new tokens to `emit(out, start, end, last)`;
        TTFT (from arrival, queueing included), the gaps between steps and the spec-decode counters are
        measured, then accounted in /metrics."""
        text = self.text
        builder = text.output_builder(thinking=thinking)
        budget = text.budget(len(prompt_ids), max_tokens)
        counts = text.new_counts()
        spec = RequestSpec(self.metrics, self.made_up_acceptance, self.made_up_answer)
        arrived = time.monotonic()
        ttft: float | None = None
        gaps: list[float] = []
        self.waiting += 1
        async with self.slots:
            self.waiting -= 1
            self.running += 1
            held = len(prompt_ids)
            self.inflight_tokens += held
            dies = self._dies_now()
            try:
                delay = self.cfg.latency + self.faults.slow_s
                if delay:
                    await asyncio.sleep(delay)
                last_at = None
                async for tokens in text.rounds(prompt_ids, max_tokens=max_tokens, sampling=sampling,
                                                counts=counts, step_latency=self.cfg.latency_per_token):
                    now = time.monotonic()
                    if last_at is None:
                        ttft = now - arrived
                    else:
                        gaps.append(now - last_at)
                    last_at = now
                    start = len(builder.out.ids)
                    builder.feed(tokens)
                    self.inflight_tokens += len(tokens)
                    held += len(tokens)
                    end = len(builder.out.ids)
                    last = tokens[-1] == text.eos_id or end >= budget
                    spec.step(end, counts, builder.out.reasoning_tokens)  # before its tokens go out, as vLLM
                    if emit is not None:
                        await emit(builder.out, start, end, last)
                    if dies and emit is not None and not last:
                        self._die()  # a stream dies midway, after a part of the answer went out
                if dies:
                    self._die()  # a plain answer (or a one-step stream) dies before it is sent
            except ConnectionResetError:  # the client went away: vLLM aborts the request
                builder.out.finish_reason = "abort"
                spec.step(len(builder.out.ids), counts, builder.out.reasoning_tokens)
                self._account_live(builder.out, len(prompt_ids), arrived, ttft, gaps)
                raise
            finally:
                self.running -= 1
                self.inflight_tokens -= held
        out = builder.finish()
        spec.step(len(out.ids), counts, out.reasoning_tokens)
        self._account_live(out, len(prompt_ids), arrived, ttft, gaps)
        return out

    def _account_live(self, out: chat.Output, prompt_tokens: int, arrived: float, ttft: float | None,
                      gaps: list[float]) -> None:
        """The request's end in /metrics; its spec-decode counters went in step by step (RequestSpec)."""
        e2e = time.monotonic() - arrived
        self.metrics.finished(reason=out.finish_reason, prompt_tokens=prompt_tokens, completion_tokens=len(out.ids),
                              ttft=ttft if ttft is not None else e2e, e2e=e2e, itl=gaps)
        self._after_generation()

    async def _live_stream(self, request: web.Request, enc: chat.ChunkEncoder, prompt_ids: list[int], thinking: bool,
                           max_tokens: int, sampling: Any, first_ids: list[int] | None, want_usage: bool,
                           reasoning_detail: bool,
                           encode: Callable[[chat.Output, int, int, str | None], bytes]) -> web.StreamResponse:
        """A stream written step by step as the model computes: one delta per step (split where reasoning
        turns into content), the finish reason on the last."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)

        async def emit(out: chat.Output, start: int, end: int, last: bool) -> None:
            spans = chat.chunk_spans_between(out, start, end)
            finish = ("stop" if out.ids[-1] == self.text.eos_id else "length") if last else None
            # vLLM sends the role chunk with the first output, not before it (a client's TTFT is taken
            # at the first chunk that carries a choice)
            head = [enc.first(first_ids)] if start == 0 and encode == enc.delta else []
            await resp.write(b"".join([*head, *(encode(out, a, b, finish if i == len(spans) - 1 else None)
                                                for i, (a, b) in enumerate(spans))]))

        try:
            out = await self._generate_live(prompt_ids, thinking, max_tokens, sampling, emit)
        except ConnectionResetError:
            return resp  # nobody left to write to
        tail = [enc.usage(chat.usage(len(prompt_ids), out, reasoning_detail=reasoning_detail))] if want_usage else []
        await resp.write(b"".join([*tail, chat.DONE]))
        await resp.write_eof()
        return resp

    async def _hidden_states(self, request_id: str, prompt_ids: list[int], body: dict[str, Any]) -> dict | None:
        """Extraction mode: the prompt's hidden states written, and the kv_transfer_params naming them."""
        if self.extractor is None:
            return None
        return await self.extractor.capture(request_id, prompt_ids, body.get("kv_transfer_params"))

    async def _run(self, prompt_tokens: int, out: chat.Output) -> None:
        """Hold a batch slot for the simulated generation time and account for it."""
        self.waiting += 1
        async with self.slots:
            self.waiting -= 1
            self.running += 1
            held = prompt_tokens + len(out.ids)
            self.inflight_tokens += held
            start = time.monotonic()
            try:
                ttft = self.cfg.latency + self.faults.slow_s
                total = ttft + self.cfg.latency_per_token * len(out.ids)
                if total > 0:
                    await asyncio.sleep(total)
                if self._dies_now():
                    self._die()
            finally:
                self.running -= 1
                self.inflight_tokens -= held
            self.metrics.finished(reason=out.finish_reason, prompt_tokens=prompt_tokens,
                                  completion_tokens=len(out.ids), ttft=ttft, e2e=time.monotonic() - start,
                                  acceptance=self.made_up_acceptance)
        self._after_generation()

    async def _stream(self, request: web.Request, enc: chat.ChunkEncoder, out: chat.Output, prompt_len: int,
                      prompt_ids: list[int] | None, usage: dict[str, Any] | None,
                      encode: Callable[[chat.Output, int, int, str | None], bytes]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        self.waiting += 1
        async with self.slots:
            self.waiting -= 1
            self.running += 1
            held = len(out.ids) + prompt_len
            self.inflight_tokens += held
            start = time.monotonic()
            ttft = self.cfg.latency + self.faults.slow_s
            try:
                if ttft:
                    await asyncio.sleep(ttft)
                spans = chat.chunk_spans(out, self.cfg.chunk_tokens())
                per_token = self.cfg.latency_per_token
                dies = self._dies_now()
                spec = RequestSpec(self.metrics, self.made_up_acceptance, self.made_up_answer)
                thought = list(itertools.accumulate((k == chat.REASONING for k in out.kinds), initial=0))
                batch = [enc.first(prompt_ids) if encode == enc.delta else b""]
                for i, (a, b) in enumerate(spans):
                    if dies and i >= len(spans) // 2:
                        await resp.write(b"".join(batch))
                        self._die()
                    if per_token:  # a step at a time: its counters before its tokens go out, as vLLM's
                        spec.step(b, None, thought[b])
                    batch.append(encode(out, a, b, out.finish_reason if i == len(spans) - 1 else None))
                    # with no per-token delay one write per 256 events keeps the cost per request low
                    if per_token or len(batch) >= 256:
                        await resp.write(b"".join(batch))
                        batch = []
                        if per_token:
                            await asyncio.sleep(per_token * (b - a))
                if usage is not None:
                    batch.append(enc.usage(usage))
                batch.append(chat.DONE)
                await resp.write(b"".join(batch))
            finally:
                self.running -= 1
                self.inflight_tokens -= held
            spec.step(len(out.ids), None, out.reasoning_tokens)
            self.metrics.finished(reason=out.finish_reason, prompt_tokens=prompt_len, completion_tokens=len(out.ids), ttft=ttft,
                                  e2e=time.monotonic() - start)
        self._after_generation()
        await resp.write_eof()
        return resp
