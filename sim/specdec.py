"""Real EAGLE-3 speculative decoding on CPU for the stand-in's tiny verifier (the `tinylm` text backend).

Started as vLLM is, with `--speculative-config '{"method": "eagle3", "model": DIR, ...}'` naming a
speculators-format checkpoint (config.json with `speculators_model_type: "eagle3"`), the stand-in loads
the draft with speculators' own `Eagle3DraftModel` (attention set to sdpa before loading: the
implementation is not saved, and FlexAttention needs a GPU) and decodes the way vLLM's EAGLE-3 proposer
and rejection sampler do:

- The verifier's forward pass gives, for every position, the aux hidden states (HF
  `output_hidden_states[L]` for each aux layer id L: the state entering layer L, vLLM's convention, the
  same definition as sim/hidden_states.py) and its logits.
- The draft reads, for each verified position t, the fused aux states of t and the token at t+1, at
  position t+1 (speculators' `shift_batch` alignment); then it runs K-1 more steps on its own output
  state and its own (greedy) token, with a KV cache that keeps the verified entries and drops the
  speculative ones after each round.
- The verifier checks the K draft tokens in ONE forward pass over [last token, d_1 .. d_K]. At
  temperature 0 draft token j is accepted when it is the verifier's argmax; otherwise (vLLM treats an
  EAGLE draft as a point mass, q(d) = 1) it is accepted with probability p(d), p the verifier's
  distribution after temperature/top-k/top-p, and a rejection samples from the residual p with d removed,
  renormalised. Either way the first rejection ends the round with the verifier's own token, and a round
  that accepts all K adds the bonus token: the output has the verifier's distribution exactly.
- Counters per round as vLLM's /metrics has them: one draft, K draft tokens, the accepted count, and the
  accepted count per position (a position counts only when every earlier one was accepted).

Pure pieces (`accept_greedy`, `accept_sampled`, `SpecCounts`) are tested on their own; the loop is
`speculative_rounds`, a generator of the tokens each round emits (1 + accepted), which the server streams.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

EAGLE3 = "eagle3"
ATTN_IMPL = "sdpa"  # speculators' default FlexAttention has no CPU path


class DrafterError(RuntimeError):
    """The drafter cannot be served; the message says which file or value and why."""


@dataclass
class SpecCounts:
    """Spec-decode totals (one request, or a window of many): vLLM's four counters."""
    k: int
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.per_pos:
            self.per_pos = [0] * self.k

    def add_round(self, proposed: int, accepted: int) -> None:
        self.drafts += 1
        self.draft_tokens += proposed
        self.accepted += accepted
        for j in range(accepted):
            self.per_pos[j] += 1

    def merge(self, other: "SpecCounts") -> None:
        self.drafts += other.drafts
        self.draft_tokens += other.draft_tokens
        self.accepted += other.accepted
        self.per_pos = [a + b for a, b in zip(self.per_pos, other.per_pos)]

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1 + self.accepted / self.drafts if self.drafts else None


# ---- the checkpoint -------------------------------------------------------------------------------------
def read_checkpoint_config(path: str) -> dict[str, Any] | None:
    """The drafter directory's config.json, or None when there is no such file (a path the stand-in can
    only simulate). A config.json that is unreadable or not EAGLE-3 in speculators format is an error."""
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        return None
    try:
        with open(cfg_path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except (OSError, ValueError) as exc:
        raise DrafterError(f"{cfg_path}: cannot read the drafter's config ({exc})") from None
    if not isinstance(raw, dict):
        raise DrafterError(f"{cfg_path}: expected a JSON object")
    kind = raw.get("speculators_model_type")
    if kind != EAGLE3:
        what = f"speculators_model_type {kind!r}" if kind else "no speculators_model_type"
        raise DrafterError(f"{cfg_path}: {what}; method eagle3 needs a speculators-format EAGLE-3 checkpoint "
                           f"(convert others with `speculators convert --algorithm eagle3`)")
    return raw


def checkpoint_aux_layers(raw: dict[str, Any]) -> tuple[int, ...] | None:
    ids = raw.get("eagle_aux_hidden_state_layer_ids")
    if isinstance(ids, list) and ids and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return tuple(ids)
    return None


class Eagle3Drafter:
    """A speculators Eagle3DraftModel run incrementally, one step at a time, with its own KV cache."""

    def __init__(self, model: Any, aux_layer_ids: Sequence[int], path: str):
        import torch

        self._torch = torch
        self.model = model
        self.aux_layer_ids = tuple(int(i) for i in aux_layer_ids)
        self.path = path
        self.hidden_size = int(model.hidden_size)
        self._to_target = model.d2t if getattr(model, "use_draft_vocab", False) else None
        # speculators' default draft layer attends over a sliding window (2048 for its CLI); the mask below
        # is its training mask: causal within the window of the anchor position, plus the draft's own
        # entries for that anchor
        self.window = int(model.sliding_window) if getattr(model, "uses_sliding_window_attn", False) else None
        self.sliding_layers = set(getattr(model, "sliding_window_indices", ()) or ())

    @classmethod
    def load(cls, path: str, verifier_dir: str, verifier_config: Any) -> "Eagle3Drafter":
        """Load the checkpoint at `path` for the served verifier (its directory and HF config)."""
        import torch

        raw = read_checkpoint_config(path)
        if raw is None:
            raise DrafterError(f"{path}: no config.json (not a drafter checkpoint)")
        aux = checkpoint_aux_layers(raw)
        layers = int(verifier_config.num_hidden_layers)
        if aux is None:
            raise DrafterError(f"{path}/config.json: eagle_aux_hidden_state_layer_ids is missing; the stand-in "
                               f"does not guess vLLM's default for a {layers}-layer verifier")
        bad = [i for i in aux if not 0 <= i < layers]
        if bad:
            raise DrafterError(f"{path}/config.json: aux layer ids {list(bad)} are out of range for the served "
                               f"verifier ({layers} decoder layers: 0..{layers - 1}, the state entering a layer)")
        from loguru import logger
        from speculators.models.eagle3.core import Eagle3DraftModel

        logger.disable("speculators")  # its file-lookup chatter would land between vLLM's log lines
        config = Eagle3DraftModel.config_class.from_pretrained(path)
        tl = config.transformer_layer_config
        if int(tl.hidden_size) != int(verifier_config.hidden_size):
            raise DrafterError(f"{path}/config.json: the drafter's hidden size {tl.hidden_size} is not the served "
                               f"verifier's {verifier_config.hidden_size}: it was trained for another model")
        if int(tl.vocab_size) != int(verifier_config.vocab_size):
            raise DrafterError(f"{path}/config.json: the drafter's verifier vocabulary ({tl.vocab_size}) is not the "
                               f"served verifier's ({verifier_config.vocab_size}): it was trained for another model")
        tl._attn_implementation = ATTN_IMPL  # noqa: SLF001 - not saved in a checkpoint; set before loading
        # vLLM takes the verifier's embedding and norm from the model it serves, not from the path saved at
        # training time (which may not exist on this host)
        config.speculators_config.verifier.name_or_path = str(verifier_dir)
        model = Eagle3DraftModel.from_pretrained(path, config=config, dtype=torch.float32)
        model = model.float().eval()
        if torch.isnan(model.lm_head.weight).any() or torch.isnan(model.embed_tokens.weight).any():
            raise DrafterError(f"{path}: the drafter's lm_head or embedding was never loaded (NaN weights)")
        return cls(model, aux, path)

    @property
    def speculative_tokens(self) -> int | None:
        """The K the checkpoint was trained for (its greedy proposal method), if it says."""
        try:
            methods = self.model.config.speculators_config.proposal_methods
            return int(methods[0].speculative_tokens)
        except (AttributeError, IndexError, TypeError, ValueError):
            return None

    def fuse(self, aux: Any) -> Any:
        """[q, num_aux * hidden] aux states -> [q, hidden]: the draft's input projection, as in training."""
        m = self.model
        states = aux.unsqueeze(0)
        if m.input_norm is not None:
            states = m.input_norm(states)
        if m.fc_norm is not None:
            chunks = states.chunk(len(m.fc_norm), dim=-1)
            states = self._torch.cat([norm(c) for norm, c in zip(m.fc_norm, chunks)], dim=-1)
        return m.fc(states)[0]

    def _mask(self, q: int, past: int, anchor: int | None, window: int | None) -> Any:
        """Which cached entries each of q new ones attends to (None: all of them). New verified entries
        (anchor None) see the entries before them, causally; a speculative entry sees the verified entries
        up to its anchor and the speculative ones after it (its own earlier drafts)."""
        torch = self._torch
        total = past + q
        if anchor is None:
            if q == 1 and (window is None or total <= window):
                return None
            keys = torch.arange(total).unsqueeze(0)
            queries = torch.arange(past, total).unsqueeze(1)
            allowed = keys <= queries
            if window is not None:
                allowed &= keys > queries - window
        else:
            if window is None or anchor + 1 <= window:
                return None
            # verified entries within the window up to the anchor, and every speculative one after it
            allowed = (torch.arange(total) > anchor - window).unsqueeze(0).expand(q, total)
        return allowed[None, None]

    def step(self, tokens: Sequence[int], hidden: Any, first_position: int, cache: Any,
             anchor: int | None = None) -> tuple[Any, Any]:
        """Run the draft on q new entries (token ids in the verifier's vocabulary, their input states
        [q, hidden], positions first_position ..): (logits [q, draft vocab], output states [q, hidden]).
        `anchor`: for a speculative step, the cache index of the verified entry the drafts extend."""
        torch, m = self._torch, self.model
        q = len(tokens)
        past = cache.get_seq_length()
        ids = torch.tensor([list(tokens)], dtype=torch.long)
        states = torch.cat([m.embed_tokens(ids), hidden.unsqueeze(0)], dim=-1)
        positions = torch.arange(first_position, first_position + q, dtype=torch.long).unsqueeze(0)
        cache_position = torch.arange(past, past + q, dtype=torch.long)
        full = self._mask(q, past, anchor, None)
        windowed = self._mask(q, past, anchor, self.window) if self.window is not None else full
        rotary = m.rotary_emb(states, positions)
        for i, layer in enumerate(m.layers):
            states = layer(states, attention_mask=windowed if i in self.sliding_layers else full,
                           position_ids=positions, past_key_values=cache, cache_position=cache_position,
                           position_embeddings=rotary)
        if m.config.norm_output:
            states = m.norm(states)
            logits = m.lm_head(states)
        else:
            logits = m.lm_head(m.norm(states))
        return logits[0], states[0]

    def to_target(self, draft_id: int) -> int:
        """A draft-vocabulary id in the verifier's vocabulary (speculators: target = draft + d2t[draft])."""
        if self._to_target is None:
            return draft_id
        return draft_id + int(self._to_target[draft_id])


# ---- acceptance (pure) ----------------------------------------------------------------------------------
def accept_greedy(target_logits: Any, draft: Sequence[int]) -> tuple[int, int]:
    """Temperature 0: (accepted count, the verifier's next token). target_logits [k+1, vocab]: row j is the
    verifier's prediction for the position of draft token j (row k: the bonus position)."""
    choices = target_logits.argmax(dim=-1).tolist()
    for j, token in enumerate(draft):
        if choices[j] != token:
            return j, choices[j]
    return len(draft), choices[len(draft)]


def accept_sampled(target_probs: Any, draft: Sequence[int], generator: Any) -> tuple[int, int]:
    """Temperature > 0, a greedy (point-mass) draft: accept draft token j with probability p_j(d_j); on
    the first rejection sample from p_j without d_j (the residual max(0, p - q), renormalised); after k
    acceptances sample the bonus from p_k. The emitted tokens are distributed as the verifier's p."""
    import torch

    for j, token in enumerate(draft):
        p = target_probs[j]
        if float(torch.rand(1, generator=generator)) < float(p[token]):
            continue
        residual = p.clone()
        residual[token] = 0.0
        total = float(residual.sum())
        if total <= 0.0:  # p(d) == 1 cannot be rejected; only float rounding gets here
            continue
        return j, int(torch.multinomial(residual / total, 1, generator=generator))
    return len(draft), int(torch.multinomial(target_probs[len(draft)], 1, generator=generator))


def synthetic_rates(k: int, rates: Sequence[float] | None, length: float | None) -> tuple[float, ...]:
    """vLLM's synthetic rejection sampler settings as per-position *unconditional* rates (the share of drafts
    whose first i+1 tokens are all accepted), resolved and checked as vLLM 0.32 does
    (vllm/config/speculative.py:556-598): exactly one of the two; a length L in [1, K+1] becomes the
    minimum-variance schedule [1]*floor(L-1) + [frac] + [0]*...; rates have length K, lie in [0, 1] and do
    not increase. ValueError with vLLM's message otherwise."""
    if (rates is None) == (length is None):
        raise ValueError("rejection_sample_method='synthetic' requires exactly one of "
                         "synthetic_acceptance_rates or synthetic_acceptance_length.")
    if rates is not None:
        rates = [float(r) for r in rates]
        if len(rates) != k:
            raise ValueError(f"synthetic_acceptance_rates must have length {k}, got {rates}.")
        if not all(0.0 <= r <= 1.0 for r in rates):
            raise ValueError(f"synthetic_acceptance_rates entries must be in [0, 1], got {rates}.")
        if any(rates[i] > rates[i - 1] for i in range(1, k)):
            raise ValueError(f"synthetic_acceptance_rates must be non-increasing, got {rates}.")
        return tuple(rates)
    assert length is not None
    if not 1.0 <= length <= float(k + 1):
        raise ValueError(f"synthetic_acceptance_length must be in [1, {k + 1}], got {length}.")
    drafted = length - 1
    full = int(drafted)
    return tuple(([1.0] * full + [drafted - full] + [0.0] * (k - full - 1))[:k])


def conditional_rates(rates: Sequence[float]) -> tuple[float, ...]:
    """Unconditional to conditional per-position rates, c_i = p_i / p_(i-1) (vllm/v1/spec_decode/utils.py:848)."""
    return tuple(p / q if q > 0.0 else 0.0 for p, q in zip(rates, [1.0, *rates[:-1]]))


def accept_synthetic(conditional: Sequence[float], draft: Sequence[int], generator: Any) -> int:
    """vLLM's synthetic mode (rejection_sampler.py, the greedy and random kernels): draft token j is accepted
    when a uniform draw is below the conditional rate of position j, whatever the verifier says; the first
    rejection ends the round. The accepted count."""
    import torch

    for j in range(len(draft)):
        rate = conditional[j] if j < len(conditional) else 0.0
        if not float(torch.rand(1, generator=generator)) < rate:
            return j
    return len(draft)


# ---- the decoding loop ----------------------------------------------------------------------------------
@dataclass
class Verifier:
    """The served model as the loop needs it: the HF causal LM, its aux layer ids, EOS and context."""
    model: Any
    eos_id: int
    max_positions: int


def _verify(verifier: Verifier, tokens: Sequence[int], cache: Any, aux_ids: Sequence[int]) -> tuple[Any, Any]:
    import torch

    out = verifier.model(input_ids=torch.tensor([list(tokens)], dtype=torch.long), past_key_values=cache,
                         use_cache=True, output_hidden_states=True)
    # in layer order, as vLLM's models hand them over (interfaces.py keeps the ids sorted), as the files were
    aux = torch.cat([out.hidden_states[i][0] for i in sorted(set(aux_ids))], dim=-1)
    return out.logits[0].float(), aux


def _keep(cache: Any, length: int) -> None:
    """Cut a KV cache back to its first `length` entries."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def speculative_rounds(verifier: Verifier, drafter: Eagle3Drafter, prompt_ids: Sequence[int], *, budget: int,
                       k: int, probs: Callable[[Any], Any] | None, generator: Any,
                       counts: SpecCounts, synthetic: Sequence[float] | None = None) -> Iterator[list[int]]:
    """Yield the tokens of each verifier step: the first token after the prompt, then 1 + accepted per
    round, until EOS or `budget` tokens. `probs(logits)` is the sampling distribution (None: greedy).
    `synthetic`: vLLM's synthetic sampler's conditional rates (acceptance set, not measured; a rejected
    position takes the verifier's own pick). Adds each round to `counts`."""
    import torch
    from transformers import DynamicCache

    if budget <= 0:
        return
    aux_ids = drafter.aux_layer_ids

    def pick(logits: Any) -> int:
        if probs is None:
            return int(logits.argmax())
        return int(torch.multinomial(probs(logits), 1, generator=generator))

    v_cache, d_cache = DynamicCache(), DynamicCache()
    logits, aux = _verify(verifier, prompt_ids, v_cache, aux_ids)
    token = pick(logits[-1])
    emitted = 1
    yield [token]
    if token == verifier.eos_id:
        return
    verified = len(prompt_ids)  # entries in the verifier's cache; `token` is the next, not yet fed
    # step-0 entries the draft has not read yet: for verified position t, the token at t+1 and t's aux state
    pending_tokens = list(prompt_ids[1:]) + [token]
    pending_aux = aux
    while emitted < budget:
        room = verifier.max_positions - verified - 1  # positions left after `token`
        kk = max(0, min(k, room))
        committed = d_cache.get_seq_length()
        draft: list[int] = []
        if kk:
            logits_d, states = drafter.step(pending_tokens, drafter.fuse(pending_aux), committed + 1, d_cache)
            draft.append(drafter.to_target(int(logits_d[-1].argmax())))
            state = states[-1:]
            anchor = committed + len(pending_tokens) - 1
            position = anchor + 2
            for _ in range(kk - 1):
                logits_d, state = drafter.step(draft[-1:], state, position, d_cache, anchor)
                draft.append(drafter.to_target(int(logits_d[-1].argmax())))
                position += 1
        logits, aux = _verify(verifier, [token] + draft, v_cache, aux_ids)
        if synthetic is not None:
            accepted = accept_synthetic(synthetic, draft, generator)
            nxt = pick(logits[accepted])
        elif probs is None:
            accepted, nxt = accept_greedy(logits, draft)
        else:
            accepted, nxt = accept_sampled(torch.stack([probs(row) for row in logits]), draft, generator)
        if kk:
            counts.add_round(kk, accepted)
        _keep(v_cache, verified + 1 + accepted)
        _keep(d_cache, committed + len(pending_tokens))  # the verified entries; the speculative ones go
        verified += 1 + accepted
        new = draft[:accepted] + [nxt]
        pending_tokens, pending_aux = new, aux[:accepted + 1]
        if verifier.eos_id in new:
            new = new[:new.index(verifier.eos_id) + 1]
        new = new[:budget - emitted]
        emitted += len(new)
        token = nxt
        yield new
        if verifier.eos_id in new or verified >= verifier.max_positions:
            return
