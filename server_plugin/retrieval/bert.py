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
folder's `max_seq_length`). A search's query may be embedded in bfloat16 instead, where this CPU
runs that clearly faster (`choose_query_precision`).
"""

from __future__ import annotations

import json
import os
import platform
import time
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


def may_compute_bfloat16(torch: Any) -> bool:
    """False on an x86 CPU torch runs without AVX-512: it has no bfloat16 instructions (they come
    with AVX-512 or AMX), so bfloat16 is emulated there and the trial is not made (on a 2-vCPU
    AMD EPYC with AVX2 it took ~3 s of the model's load beside the index's build). Elsewhere
    (AVX-512, ARM) the trial decides."""
    x86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")
    return not (x86 and str(torch.backends.cpu.get_cpu_capability()) in ("AVX2", "DEFAULT"))


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
        self._half: dict[str, Any] | None = None  # bfloat16 layers for queries (choose_query_precision)
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

    def _ids(self, texts: Sequence[str]) -> tuple[Any, Any]:
        """Token ids and attention mask of `texts`, padded to the longest (as sentence-transformers
        tokenizes: each text stripped, lower-cased where the folder says so)."""
        torch = self._torch
        clean = [t.strip() for t in texts]
        if self.shape.lower_case:
            clean = [t.lower() for t in clean]
        encoded = self._tokenizer.encode_batch(clean)
        width = max(len(e.ids) for e in encoded)
        ids = torch.zeros((len(encoded), width), dtype=torch.long)
        mask = torch.zeros((len(encoded), width), dtype=torch.long)
        for row, e in enumerate(encoded):
            ids[row, :len(e.ids)] = torch.tensor(e.ids, dtype=torch.long)
            mask[row, :len(e.ids)] = 1
        return ids, mask

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
            qkv = f.linear(x, w[at + "attention.self.qkv.weight"], w[at + "attention.self.qkv.bias"])
            q, k, v = qkv.view(n, width, 3, heads, size).permute(2, 0, 3, 1, 4).unbind(0)
            a = f.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            a = a.transpose(1, 2).reshape(n, width, shape.hidden)
            a = f.linear(a, w[at + "attention.output.dense.weight"], w[at + "attention.output.dense.bias"])
            x = self._layer_norm(a + x, at + "attention.output.LayerNorm", w)
            h = f.gelu(f.linear(x, w[at + "intermediate.dense.weight"], w[at + "intermediate.dense.bias"]))
            h = f.linear(h, w[at + "output.dense.weight"], w[at + "output.dense.bias"])
            x = self._layer_norm(h + x, at + "output.LayerNorm", w)
        return x.float()

    def encode(self, texts: Sequence[str], batch_size: int = 32, query: bool = False) -> np.ndarray:
        """Unit vectors of `texts`, shape (len(texts), dim): mean of the token vectors under the
        mask, then normalised. Texts are batched by length (less padding), returned in order.
        `query`: in bfloat16 where `choose_query_precision` chose it (a search's query; what is
        stored is always embedded in float32, as sentence-transformers does)."""
        torch = self._torch
        layers = self._half if query else None
        graph = self._query_graph if query and len(texts) == 1 else None
        if graph is not None:
            ids, _ = self._ids(texts)
            with torch.inference_mode():
                return graph(ids).numpy()
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                rows = order[start:start + batch_size]
                out[rows] = self._pooled(*self._ids([texts[i] for i in rows]), layers).numpy()
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
        layers = self._half

        class OneText(torch.nn.Module):
            def __init__(self, encoder: "Encoder") -> None:
                super().__init__()
                self.encoder = encoder

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

    def choose_query_precision(self, probes: Sequence[str], tries: int = 5) -> str:
        """bfloat16 for queries where this CPU runs it clearly faster than float32 (one with
        bfloat16 instructions: about half the time of a query) and its vectors stay within
        `HALF_COSINE` of float32's for every probe; else float32 (a CPU that emulates bfloat16
        would be slower). On LoCoMo, queries embedded in bfloat16 give recall within 0.001 of
        float32's (docs/search.md). Returns the precision chosen."""
        full = self.encode(list(probes))  # float32 outside the try: a model that fails there fails to load
        if not may_compute_bfloat16(self._torch):
            return "float32"
        try:
            self.use_half()
            half = self.encode(list(probes), query=True)
            if bool(np.all(np.sum(full * half, axis=1) >= HALF_COSINE)):
                text, costs = probes[len(probes) // 2], {False: 0.0, True: 0.0}
                for query in (False, True, True, False):  # interleaved: a load that comes and goes hits both
                    costs[query] += self._cost(text, query, tries)
                if costs[True] < HALF_GAIN * costs[False]:
                    return "bfloat16"
        except RuntimeError:  # a torch build without bfloat16 kernels for one of these operations
            pass
        self._half = self._query_graph = None
        return "float32"

    def use_half(self) -> None:
        """Embed queries in bfloat16 from now on (the layers' weights converted once)."""
        torch = self._torch
        self._query_graph = None  # traced in the precision before
        self._half = {k: v.to(torch.bfloat16) for k, v in self._w.items() if k.startswith("encoder.")}

    def _cost(self, text: str, query: bool, tries: int) -> float:
        """Seconds `tries` embeddings of `text` take: this thread's CPU time where torch computes
        on this thread alone (at start-up the index is built beside it: waiting for the
        interpreter or a core is not the precision's cost), else the wall clock."""
        clock = time.thread_time if self._torch.get_num_threads() == 1 else time.perf_counter
        self.encode([text], query=query)  # its kernels made for this shape first
        started = clock()
        for _ in range(tries):
            self.encode([text], query=query)
        return clock() - started

    @property
    def query_precision(self) -> str:
        """The precision queries are embedded in ("bfloat16" or "float32")."""
        return "float32" if self._half is None else "bfloat16"
