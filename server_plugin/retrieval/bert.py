"""A BERT sentence encoder read straight from a sentence-transformers folder (the packaged
all-MiniLM-L6-v2, or any folder of the same shape), with torch, `tokenizers` and safetensors.

sentence-transformers is most of a start-up: importing it pulls transformers, scikit-learn and
scipy (about 4 s of 6 on this machine), and at start-up that import shares the interpreter with the
search index's build, so "ready" waited for both. The model itself is six layers of a few matrix
products; this module runs them directly and imports sentence-transformers not at all.

It reads only the plain shape: modules Transformer → Pooling (mean of the tokens only) →
Normalize, a `bert` config with absolute positions and exact GELU, the weights in
`model.safetensors` and a fast tokenizer's `tokenizer.json`. Any other folder gives None from
`layout` (or, weights named otherwise, a ValueError from `Encoder`) and the embedder loads it
through sentence-transformers as before. Its vectors are the ones sentence-transformers gives for
the same texts (tests/test_bert.py: within 1e-5, alone and in padded batches, truncated at the
folder's `max_seq_length`). A search's query may be embedded in bfloat16 or with int8 products
instead, where this CPU runs that clearly faster and close enough (`choose_query_precision`).
"""

from __future__ import annotations

import json
import os
import platform
import time
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

_MODULES = ("sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling",
            "sentence_transformers.models.Normalize")
_FIRST = "encoder.layer.0.attention.self.qkv.weight"  # its dtype is the layers' precision
# bfloat16 is kept for queries only if it takes less than this share of float32's time and its
# vectors are this close to float32's (cosine) on every probe. With bfloat16 instructions a query
# takes 0.6-0.7 of the time on a quiet core, 0.85 beside a start-up's index build; a CPU that
# emulates them takes longer than float32.
HALF_GAIN = 0.9
HALF_COSINE = 0.9995
# int8 products (torch's dynamic quantized linear: the weights in int8 per output row, each
# input quantized as it comes, with one scale for all its tokens) for a query's `_INT8_LAYERS`,
# kept where within this cosine of float32 on every probe. The feed-forward's second product
# stays float32: its inputs (after GELU) have a few tokens far larger than the rest, and in int8
# it took a 60-token text to cosine 0.95. Measured on 100 LoCoMo questions and 60 passages of
# 4-14 turns: cosine to float32 at least 0.998 (mean 0.999; 0.992-0.998 for a word or two), a
# query in ~0.55 of float32's time on AVX2; recall on LoCoMo within 0.002 (docs/search.md section 6).
INT8_COSINE = 0.99
_INT8_LAYERS = ("attention.self.qkv", "attention.output.dense", "intermediate.dense")
_MAXIMA, _ROWS = "calibration maxima", "calibration rows"  # keys of _int8_layers' recording pass
# A key of int8 layers (their mark, `query_precision`): a batch of queries is embedded text by text.
_ALONE = "one text at a time"
INT8_SMOOTHING = 0.7
_CALIBRATION = (
    "Where did you leave the key to the tower?", "What did the captain promise us last winter?",
    "I draw my sword and step between the thief and the child.",
    "She laughed, poured two cups of tea and said nothing about the letter.",
    "The storm broke over the harbour at midnight; three ships were lost and the mayor fled north.",
    "Do you remember the name of the inn where we first met?", "hi", "ok, let's go",
    "\"Stay behind me,\" Ayla whispered, raising the lantern toward the cellar stairs.",
    "Summary: the party crossed the marsh, bargained with the witch for a map and camped by the river.",
    "Why would the duke lie about his brother's death?", "I check the chest for traps.")
_MEAN_ONLY = {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False,
              "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}


@dataclass(frozen=True)
class Layout:
    """What the encoder needs from a folder's configuration files."""

    layers: int
    hidden: int
    heads: int
    eps: float
    max_tokens: int  # sentence-transformers' max_seq_length, capped by the position table
    lower_case: bool


def _json(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def layout(path: str) -> Layout | None:
    """The folder's layout when it has the plain shape this module runs (see the module's
    docstring), else None (the caller loads it through sentence-transformers)."""
    try:
        modules = _json(os.path.join(path, "modules.json"))
        if tuple(m.get("type") for m in modules) != _MODULES or modules[0].get("path", "") != "":
            return None
        pooling = _json(os.path.join(path, modules[1]["path"], "config.json"))
        config = _json(os.path.join(path, "config.json"))
        st = _json(os.path.join(path, "sentence_bert_config.json"))
        if any(bool(pooling.get(k, False)) != v for k, v in _MEAN_ONLY.items()):
            return None
        if (config.get("model_type") != "bert" or config.get("hidden_act") != "gelu"
                or config.get("position_embedding_type", "absolute") != "absolute"
                or config["hidden_size"] % config["num_attention_heads"]):
            return None
        if not all(os.path.isfile(os.path.join(path, f)) for f in ("model.safetensors", "tokenizer.json")):
            return None
        return Layout(layers=int(config["num_hidden_layers"]), hidden=int(config["hidden_size"]),
                      heads=int(config["num_attention_heads"]), eps=float(config["layer_norm_eps"]),
                      max_tokens=min(int(st.get("max_seq_length") or 512),
                                     int(config["max_position_embeddings"])),
                      lower_case=bool(st.get("do_lower_case", False)))
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None


def may_compute_int8(torch: Any) -> bool:
    """Whether this torch has a quantized engine for int8 products on this CPU (fbgemm or x86 on
    x86, qnnpack on ARM); the trial then decides."""
    engines = getattr(getattr(torch.backends, "quantized", None), "supported_engines", ())
    return any(e in engines for e in ("x86", "fbgemm", "qnnpack")) and \
        hasattr(torch, "quantize_per_channel") and hasattr(torch.ops.quantized, "linear_dynamic")


def may_compute_bfloat16(torch: Any) -> bool:
    """False on an x86 CPU torch runs without AVX-512: it has no bfloat16 instructions (they come
    with AVX-512 or AMX), so bfloat16 is emulated there and the trial is not made (on a 2-vCPU
    AMD EPYC with AVX2 it took ~3 s of the model's load beside the index's build). Elsewhere
    (AVX-512, ARM) the trial decides."""
    x86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")
    return not (x86 and str(torch.backends.cpu.get_cpu_capability()) in ("AVX2", "DEFAULT"))


# A padded batch costs about its rows times its longest text's tokens, plus a fixed cost per pass
# of about as many tokens as this (one thread: a pass of one 8-token text ~10 ms, ~0.4 ms a token
# after that; scratch measurements of stop 45, AVX2).
BATCH_OVERHEAD_TOKENS = 20


def length_batches(lengths: Sequence[int], cap: int) -> list[tuple[int, int]]:
    """Cut token lengths sorted longest first into batches [start, end) of at most `cap` texts,
    with the least padded tokens plus `BATCH_OVERHEAD_TOKENS` a batch (exact, by dynamic
    programming). A fixed cut of `cap` padded every text to the batch's longest: an item's short
    passages beside its whole text took ~3x their own work."""
    best, cut = [0] * (len(lengths) + 1), [0] * (len(lengths) + 1)
    for end in range(1, len(lengths) + 1):
        best[end], cut[end] = min((best[start] + (end - start) * lengths[start] + BATCH_OVERHEAD_TOKENS,
                                   start) for start in range(max(0, end - cap), end))
    out, end = [], len(lengths)
    while end:
        out.append((cut[end], end))
        end = cut[end]
    return out[::-1]


class Encoder:
    """The folder's model, ready to embed: `encode(texts)` gives unit vectors (float32)."""

    def __init__(self, path: str, shape: Layout) -> None:
        import torch
        from safetensors.torch import load_file
        from tokenizers import Tokenizer

        self.shape = shape
        self.dim = shape.hidden
        self._torch = torch
        tokenizer = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=shape.max_tokens)  # longest_first, as the folder's own
        self._tokenizer = tokenizer
        # A query's layers, bfloat16 or with int8 products (choose_query_precision); None: float32.
        self._query_layers: dict[str, Any] | None = None
        self._query_graph: Any = None  # one query's pass, traced (trace_query)
        weights = load_file(os.path.join(path, "model.safetensors"))
        self._w = {k.removeprefix("bert."): v.float() for k, v in weights.items()}
        self._check()
        # q, k and v as one product: one pass over the layer's input instead of three.
        for i in range(shape.layers):
            at = f"encoder.layer.{i}.attention.self."
            for part in ("weight", "bias"):
                self._w[f"{at}qkv.{part}"] = torch.cat([self._w.pop(f"{at}{n}.{part}")
                                                        for n in ("query", "key", "value")])

    def _check(self) -> None:
        """Every weight the forward pass reads is there, the square ones of the configured size;
        else ValueError naming the first missing (the embedder then leaves the folder to
        sentence-transformers, which reads older names such as LayerNorm gamma and beta)."""
        h, w = self.shape.hidden, self._w
        need: dict[str, tuple[int, ...] | None] = {
            f"embeddings.{n}_embeddings.weight": None for n in ("word", "position", "token_type")}
        need |= {f"embeddings.LayerNorm.{p}": (h,) for p in ("weight", "bias")}
        for i in range(self.shape.layers):
            at = f"encoder.layer.{i}."
            for name in ("attention.self.query", "attention.self.key", "attention.self.value",
                         "attention.output.dense"):
                need |= {f"{at}{name}.weight": (h, h), f"{at}{name}.bias": (h,)}
            for name in ("attention.output.LayerNorm", "output.LayerNorm"):
                need |= {f"{at}{name}.weight": (h,), f"{at}{name}.bias": (h,)}
            need |= {f"{at}{name}.{p}": None for name in ("intermediate.dense", "output.dense")
                     for p in ("weight", "bias")}
        for name, size in need.items():
            if name not in w or (size is not None and tuple(w[name].shape) != size):
                raise ValueError(f"the model's weights have no {name}" + (f" of size {size}" if size else ""))

    def _tokens(self, texts: Sequence[str]) -> list[Any]:
        """Each text's encoding (as sentence-transformers tokenizes: each text stripped,
        lower-cased where the folder says so; cut at the folder's max_seq_length)."""
        clean = [t.strip() for t in texts]
        if self.shape.lower_case:
            clean = [t.lower() for t in clean]
        return self._tokenizer.encode_batch(clean)

    def _padded(self, encoded: Sequence[Any]) -> tuple[Any, Any]:
        """Token ids and attention mask of encodings, padded to the longest."""
        torch = self._torch
        width = max(len(e.ids) for e in encoded)
        ids = torch.zeros((len(encoded), width), dtype=torch.long)
        mask = torch.zeros((len(encoded), width), dtype=torch.long)
        for row, e in enumerate(encoded):
            ids[row, :len(e.ids)] = torch.tensor(e.ids, dtype=torch.long)
            mask[row, :len(e.ids)] = 1
        return ids, mask

    def _ids(self, texts: Sequence[str]) -> tuple[Any, Any]:
        """Token ids and attention mask of `texts`, padded to the longest."""
        return self._padded(self._tokens(texts))

    def _layer_norm(self, x: Any, name: str, w: dict[str, Any]) -> Any:
        return self._torch.nn.functional.layer_norm(x, (self.shape.hidden,), w[name + ".weight"],
                                                    w[name + ".bias"], self.shape.eps)

    def _forward(self, ids: Any, mask: Any, layers: dict[str, Any] | None = None) -> Any:
        """The token vectors of one padded batch (BERT's encoder, dropout off), float32; the
        layers' products in the precision of `layers` (the float32 weights when None)."""
        torch, shape = self._torch, self.shape
        f = torch.nn.functional
        w = self._w if layers is None else layers
        n, width = ids.shape
        heads, size = shape.heads, shape.hidden // shape.heads
        x = (self._w["embeddings.word_embeddings.weight"][ids]
             + self._w["embeddings.position_embeddings.weight"][:width]
             + self._w["embeddings.token_type_embeddings.weight"][0])
        x = self._layer_norm(x, "embeddings.LayerNorm", self._w).to(w[_FIRST].dtype)
        # Padding is masked as transformers masks it: the smallest float added to its scores.
        bias = None
        if bool((mask == 0).any()):
            bias = ((1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min).to(x.dtype)
        for i in range(shape.layers):
            at = f"encoder.layer.{i}."
            qkv = self._linear(x, w, at + "attention.self.qkv")
            q, k, v = qkv.view(n, width, 3, heads, size).permute(2, 0, 3, 1, 4).unbind(0)
            a = f.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            a = a.transpose(1, 2).reshape(n, width, shape.hidden)
            a = self._linear(a, w, at + "attention.output.dense")
            x = self._layer_norm(a + x, at + "attention.output.LayerNorm", w)
            h = self._linear(f.gelu(self._linear(x, w, at + "intermediate.dense")), w, at + "output.dense")
            x = self._layer_norm(h + x, at + "output.LayerNorm", w)
        return x.float()

    def _linear(self, x: Any, w: dict[str, Any], name: str) -> Any:
        """The layer `name`'s product: int8 where `w` has it packed (`_int8_layers`), else in
        `w`'s precision (recording its inputs' largest where `w` asks for them)."""
        torch = self._torch
        packed = w.get(name + ".int8")
        if packed is not None:
            return packed(x * w[name + ".inverse"])
        maxima = w.get(_MAXIMA)
        if maxima is not None:  # _int8_layers' calibration: each input component's largest
            top = x.detach().reshape(-1, x.shape[-1])[w[_ROWS]].abs().amax(0)
            maxima[name] = torch.maximum(maxima[name], top) if name in maxima else top
        return torch.nn.functional.linear(x, w[name + ".weight"], w[name + ".bias"])

    def encode(self, texts: Sequence[str], batch_size: int = 32, query: bool = False) -> np.ndarray:
        """Unit vectors of `texts`, shape (len(texts), dim): mean of the token vectors under the
        mask, then normalised. Texts are batched by length (`length_batches`), returned in order.
        `query`: in the precision `choose_query_precision` chose (a search's query; what is
        stored is always embedded in float32, as sentence-transformers does)."""
        torch = self._torch
        layers = self._query_layers if query else None
        if layers is not None and layers.get(_ALONE) and len(texts) > 1:
            # One at a time: an input's one scale would span the padding's rows too.
            return np.stack([self.encode([text], query=True)[0] for text in texts])
        graph = self._query_graph if query and len(texts) == 1 else None
        if graph is not None:
            ids, _ = self._ids(texts)
            with torch.inference_mode():
                return graph(ids).numpy()
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        encoded = self._tokens(texts)
        order = sorted(range(len(texts)), key=lambda i: -len(encoded[i].ids))
        with torch.inference_mode():
            for start, end in length_batches([len(encoded[i].ids) for i in order], batch_size):
                rows = order[start:end]
                out[rows] = self._pooled(*self._padded([encoded[i] for i in rows]), layers).numpy()
        return out

    def _pooled(self, ids: Any, mask: Any, layers: dict[str, Any] | None) -> Any:
        """Unit vectors of one padded batch: the mean of its token vectors under the mask."""
        tokens = self._forward(ids, mask, layers)
        m = mask[:, :, None].float()
        mean = (tokens * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return self._torch.nn.functional.normalize(mean, p=2, dim=1)

    def trace_query(self, probes: Sequence[str]) -> bool:
        """Trace one query's pass once (TorchScript, in the query precision), for `encode` to run
        instead of the eager one. The traced graph runs its operations without Python between
        them: the eager pass takes the interpreter back ~100 times a query, and while the
        request's other work holds it (BM25 and the priors of a search, a context call's other
        parts) each of those waits. Kept only when it gives the eager vectors, to the bit, for
        every probe (texts of several lengths); False otherwise, and the eager pass stays."""
        torch = self._torch
        layers = self._query_layers

        class OneText(torch.nn.Module):
            def __init__(self, encoder: "Encoder") -> None:
                super().__init__()
                self.encoder = encoder
                # int8 products are modules: the tracer follows only those registered here.
                self.products = torch.nn.ModuleList(
                    [v for v in (layers or {}).values() if isinstance(v, torch.nn.Module)])

            def forward(self, ids: Any) -> Any:
                return self.encoder._pooled(ids, torch.ones_like(ids), layers)

        # The tracer's notes on the Python values it fixes (one text, no padding: the probes below
        # check them) are off at their source: warnings' filters are process-wide and not
        # thread-safe, and this runs on the load thread beside requests.
        torch._C._jit_set_tracer_state_warn(False)
        try:
            ids, _ = self._ids([probes[len(probes) // 2]])
            with torch.inference_mode():
                graph = torch.jit.trace(OneText(self), (ids,), check_trace=False)
                same = all(torch.equal(graph(self._ids([t])[0]), self._pooled(*self._ids([t]), layers))
                           for t in probes)
        except Exception:  # a torch whose tracer cannot follow this pass: the eager one is as right
            return False
        finally:
            torch._C._jit_set_tracer_state_warn(True)
        self._query_graph = graph if same else None
        return same

    def choose_query_precision(self, probes: Sequence[str], tries: int = 5,
                               kinds: Sequence[str] = ("bfloat16", "int8")) -> str:
        """The first of `kinds` (bfloat16, int8 products) that this CPU runs clearly faster than
        float32 (`HALF_GAIN`) for queries, with vectors within its cosine (`HALF_COSINE`,
        `INT8_COSINE`) of float32's for every probe; else float32. bfloat16 is tried only where
        the CPU has its instructions (elsewhere it is emulated, and slower), int8 where torch has
        a quantized engine. On LoCoMo, queries in either give recall within 0.002 of float32's
        (docs/search.md). Queries meanwhile are embedded in float32: a precision is in use only
        once kept. Returns the precision chosen."""
        full = self.encode(list(probes))  # float32 outside the try: a model that fails there fails to load
        self._install(None)
        trials = {"bfloat16": (may_compute_bfloat16, self._half_layers, HALF_COSINE),
                  "int8": (may_compute_int8, self._int8_layers, INT8_COSINE)}
        for kind in kinds:
            may, make, cosine = trials[kind]
            layers = self._kept(make, probes, full, cosine, tries) if may(self._torch) else None
            if layers is not None:
                self._install(layers)
                return kind
        return "float32"

    def _kept(self, make: Any, probes: Sequence[str], full: np.ndarray, cosine: float,
              tries: int) -> dict[str, Any] | None:
        """The query layers `make` gives where they are kept: within `cosine` of `full` on every
        probe and under `HALF_GAIN` of float32's time; else None."""
        try:
            layers = make()
            near = self._alone(probes, layers)
            if bool(np.all(np.sum(full * near, axis=1) >= cosine)):
                text, costs = probes[len(probes) // 2], {False: 0.0, True: 0.0}
                for query in (False, True, True, False):  # interleaved: a load that comes and goes hits both
                    costs[query] += self._cost(text, layers if query else None, tries)
                if costs[True] < HALF_GAIN * costs[False]:
                    return layers
        except (RuntimeError, AttributeError, NotImplementedError):  # a torch without these kernels
            pass
        return None

    def _alone(self, texts: Sequence[str], layers: dict[str, Any] | None) -> np.ndarray:
        """Unit vectors of `texts` embedded one at a time with `layers` (eager)."""
        with self._torch.inference_mode():
            return np.stack([self._pooled(*self._ids([t]), layers).numpy()[0] for t in texts])

    def _install(self, layers: dict[str, Any] | None) -> None:
        """Queries from now on with `layers` (None: float32)."""
        self._query_graph = None  # traced in the precision before
        self._query_layers = layers

    def use_half(self) -> None:
        """Embed queries in bfloat16 from now on (the layers' weights converted once)."""
        self._install(self._half_layers())

    def use_int8(self) -> None:
        """Embed queries with int8 products from now on (`_int8_layers`)."""
        self._install(self._int8_layers())

    def _half_layers(self) -> dict[str, Any]:
        torch = self._torch
        return {k: v.to(torch.bfloat16) for k, v in self._w.items() if k.startswith("encoder.")}

    def _int8_layers(self) -> dict[str, Any]:
        """The layers with int8 products for `_INT8_LAYERS` (the others float32): each linear's
        weights smoothed by its inputs' largest on `_CALIBRATION` (INT8_SMOOTHING), quantized per
        output row and packed once."""
        torch = self._torch
        # torch 2.13 calls its quantized tensors deprecated, once per process: this use is tried
        # and left for float32 where they are gone (choose_query_precision). Only that note is
        # filtered, for good (a filter set and restored here would race other threads).
        warnings.filterwarnings("ignore", message="torch.quantize_per_tensor, torch.quantize_per_channel",
                                category=UserWarning)
        layers = {k: v for k, v in self._w.items() if k.startswith("encoder.")}
        ids, mask = self._ids(list(_CALIBRATION))
        maxima: dict[str, Any] = {}
        with torch.inference_mode():  # one padded batch, each input's padding rows left out
            self._forward(ids, mask, {**layers, _MAXIMA: maxima, _ROWS: mask.reshape(-1).bool()})
        for name, top in maxima.items():
            if not name.endswith(_INT8_LAYERS):
                continue
            weight = self._w[name + ".weight"]
            smooth = (top.clamp(min=1e-5) ** INT8_SMOOTHING
                      / weight.abs().amax(0).clamp(min=1e-5) ** (1 - INT8_SMOOTHING)).clamp(min=1e-5)
            smoothed = weight * smooth[None, :]
            scales = (smoothed.abs().amax(1) / 127).clamp(min=1e-8).double()
            rows = torch.quantize_per_channel(smoothed, scales, torch.zeros(len(scales), dtype=torch.long),
                                              0, torch.qint8)
            # torch's dynamic linear quantizes its inputs in 7 bits where fbgemm needs it (a CPU
            # without VNNI: 16-bit sums of two products would saturate); smoothing keeps that small.
            product = torch.ao.nn.quantized.dynamic.Linear(weight.shape[1], weight.shape[0],
                                                           dtype=torch.qint8)
            product.set_weight_bias(rows, self._w[name + ".bias"])
            layers[name + ".int8"] = product
            layers[name + ".inverse"] = 1 / smooth
        layers[_ALONE] = True
        return layers

    def _cost(self, text: str, layers: dict[str, Any] | None, tries: int) -> float:
        """Seconds `tries` embeddings of `text` with `layers` (None: float32) take: this thread's
        CPU time where torch computes on this thread alone (at start-up the index is built beside
        it: waiting for the interpreter or a core is not the precision's cost), else the wall clock."""
        clock = time.thread_time if self._torch.get_num_threads() == 1 else time.perf_counter
        self._alone([text], layers)  # its kernels made for this shape first
        started = clock()
        for _ in range(tries):
            self._alone([text], layers)
        return clock() - started

    @property
    def query_precision(self) -> str:
        """The precision queries are embedded in ("bfloat16", "int8" or "float32")."""
        layers = self._query_layers  # read once: another thread may install others
        if layers is None:
            return "float32"
        return "int8" if layers.get(_ALONE) else "bfloat16"
