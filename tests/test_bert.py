"""The packaged MiniLM read straight from its files (retrieval/bert.py): the vectors
sentence-transformers gives, without importing it; any other folder shape goes through
sentence-transformers as before."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from server_plugin.retrieval import bert
from server_plugin.retrieval.embeddings import Embedder, packaged_model_path

TEXTS = ["", "   ", "ok", "  Where did Ayla hide the lantern before the storm?  ",
         "Ünïcödé café — naïve résumé ☃", "Tab\tand\nnew line", "東京で会いましょう", "lantern " * 400,
         "word " * 254, "word " * 255, "I said: \"Meet me at the old mill at dawn, and bring the map.\""]


@pytest.fixture(scope="module")
def reference():
    """sentence-transformers' own load of the packaged folder (what bert.py must give)."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(packaged_model_path(), device="cpu")


@pytest.fixture(scope="module")
def encoder() -> bert.Encoder:
    path = packaged_model_path()
    shape = bert.layout(path)
    assert shape == bert.Layout(layers=6, hidden=384, heads=12, eps=1e-12, max_tokens=256, lower_case=False)
    return bert.Encoder(path, shape)


def test_the_packaged_folder_gives_sentence_transformers_vectors_alone_and_in_padded_batches(encoder,
                                                                                             reference):
    expected = reference.encode(TEXTS, normalize_embeddings=True, convert_to_numpy=True)
    batch = encoder.encode(TEXTS)
    alone = np.stack([encoder.encode([t])[0] for t in TEXTS])
    small_batches = encoder.encode(TEXTS, batch_size=3)  # other paddings, other neighbours
    for got in (batch, alone, small_batches):
        assert got.shape == (len(TEXTS), 384) and got.dtype == np.float32
        assert np.abs(got - expected).max() < 1e-5
    assert np.allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)


def test_texts_are_tokenized_as_sentence_transformers_does_stripped_and_cut_at_256(encoder, reference):
    ids, mask = encoder._ids(TEXTS)
    theirs = reference.preprocess(TEXTS)
    assert ids.tolist() == theirs["input_ids"].tolist()
    assert mask.tolist() == theirs["attention_mask"].tolist()
    assert int(mask.sum(1).max()) == 256  # the long texts are cut, [SEP] kept


def test_an_empty_list_gives_no_rows(encoder):
    assert encoder.encode([]).shape == (0, 384)


def test_length_batches_cut_for_the_least_padding_plus_a_pass_each_and_keep_the_cap():
    def cost(batches, lengths):
        return sum((end - start) * lengths[start] + bert.BATCH_OVERHEAD_TOKENS for start, end in batches)

    def every_cut(n, cap):  # every split of range(n) into consecutive batches of at most cap
        if n == 0:
            yield []
            return
        for first in range(1, min(cap, n) + 1):
            for rest in every_cut(n - first, cap):
                yield [(0, first)] + [(a + first, b + first) for a, b in rest]

    rng = np.random.default_rng(7)
    for _ in range(60):
        n, cap = int(rng.integers(1, 9)), int(rng.integers(1, 5))
        lengths = sorted(rng.integers(2, 260, n).tolist(), reverse=True)
        got = bert.length_batches(lengths, cap)
        assert [b for a, b in got][-1] == n and all(b - a <= cap for a, b in got)
        assert all(got[i][1] == got[i + 1][0] for i in range(len(got) - 1)) and got[0][0] == 0
        assert cost(got, lengths) == min(cost(c, lengths) for c in every_cut(n, cap))
    assert bert.length_batches([], 32) == []
    assert len(bert.length_batches([12] * 70, 32)) == 3  # equal lengths: as few passes as the cap allows
    assert bert.length_batches([200, 30, 28, 25, 20], 32) == [(0, 1), (1, 5)]  # a whole text apart


def test_an_items_short_passages_are_not_padded_to_its_whole_text(encoder, monkeypatch):
    whole = "The party crossed the marsh at dawn and bargained with the witch. " * 12
    texts = ["Ayla hid the lantern.", whole, "The witch wanted a map.", "They camped by the river.", "ok"]
    widths = []
    pooled = encoder._pooled
    monkeypatch.setattr(encoder, "_pooled", lambda ids, mask, layers: widths.append(tuple(ids.shape))
                        or pooled(ids, mask, layers))
    got = encoder.encode(texts)
    assert widths[0][0] == 1 and widths[0][1] > 100 and len(widths) == 2 and widths[1][1] < 12
    alone = np.stack([pooled(*encoder._ids([t]), None).numpy()[0] for t in texts])
    assert np.abs(got - alone).max() < 1e-5


def copy_of_packaged(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(packaged_model_path(), folder)
    return folder


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    data.update(changes)
    path.write_text(json.dumps(data), encoding="utf-8")


@pytest.mark.parametrize("change", ["cls pooling", "roberta", "relative positions", "no safetensors",
                                    "another module", "broken json", "another activation"])
def test_a_folder_of_another_shape_is_left_to_sentence_transformers(tmp_path, change):
    folder = copy_of_packaged(tmp_path)
    assert bert.layout(str(folder)) is not None
    if change == "cls pooling":
        edit_json(folder / "1_Pooling" / "config.json", pooling_mode_cls_token=True,
                  pooling_mode_mean_tokens=False)
    elif change == "roberta":
        edit_json(folder / "config.json", model_type="roberta")
    elif change == "relative positions":
        edit_json(folder / "config.json", position_embedding_type="relative_key")
    elif change == "another activation":
        edit_json(folder / "config.json", hidden_act="gelu_new")
    elif change == "no safetensors":
        (folder / "model.safetensors").unlink()
    elif change == "another module":
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
        modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense",
                           "type": "sentence_transformers.models.Dense"})
        (folder / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    else:
        (folder / "config.json").write_text("{not json", encoding="utf-8")
    assert bert.layout(str(folder)) is None


def test_weights_named_the_old_way_are_left_to_sentence_transformers_with_the_same_vectors(tmp_path,
                                                                                          embedder):
    """A folder of the plain shape whose weights bert.py does not find under the names it reads
    (LayerNorm gamma and beta, as older checkpoints name them) loads through sentence-transformers,
    which renames them: the same vectors, never a failed load."""
    from safetensors.torch import load_file, save_file

    folder = copy_of_packaged(tmp_path)
    weights = load_file(str(folder / "model.safetensors"))
    save_file({k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
               for k, v in weights.items()}, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="embeddings.LayerNorm.weight"):
        bert.Encoder(str(folder), bert.layout(str(folder)))
    model = Embedder(str(folder), threads=1, background_chunk=8, step_aside_seconds=0).start_loading()
    model.wait(180)
    assert model._encoder is None and model._model is not None
    text = "Where did Ayla hide the lantern before the storm?"
    embedder._cache.clear()
    assert np.abs(model.embed_one(text, 60) - embedder.embed_one(text, 60)).max() < 1e-5


def test_the_packaged_model_loads_and_embeds_without_importing_sentence_transformers(embedder):
    script = ("import sys\n"
              "from server_plugin.retrieval.embeddings import Embedder\n"
              "e = Embedder('', threads=1, background_chunk=8, step_aside_seconds=0).start_loading()\n"
              "e.wait(120)\n"
              "v = e.embed_one('Where did Ayla hide the lantern?', 60)\n"
              "print(','.join(repr(float(x)) for x in v))\n"
              "print(sorted(m for m in ('sentence_transformers', 'transformers', 'sklearn', 'scipy') "
              "if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    vector_line, imported = done.stdout.strip().splitlines()[-2:]
    assert imported == "[]"
    vector = np.array([float(x) for x in vector_line.split(",")], dtype=np.float32)
    embedder._cache.clear()
    assert np.abs(vector - embedder.embed_one("Where did Ayla hide the lantern?", 60)).max() < 1e-6


def test_queries_in_bfloat16_stay_within_its_cosine_and_what_is_stored_stays_float32(encoder):
    """bfloat16 is chosen only where it is clearly faster (this CPU's timing) and as close as
    HALF_COSINE on the probes; a query's vector is then that close to float32's, a passage's is
    float32's exactly."""
    probes = ("hi", "What did she say about the lighthouse last summer?", "word " * 300)
    choice = encoder.choose_query_precision(probes)
    assert choice == encoder.query_precision in ("bfloat16", "int8", "float32")
    try:
        encoder.use_half()
        full, half = encoder.encode(TEXTS), encoder.encode(TEXTS, query=True)
        assert np.all(np.sum(full * half, axis=1) >= bert.HALF_COSINE) and not np.array_equal(full, half)
        assert np.array_equal(encoder.encode(TEXTS), full)  # the passage path never changes
    finally:
        encoder._query_layers = None


def test_queries_with_int8_products_stay_within_its_cosine_alone_and_in_batches(encoder):
    """use_int8: the attention's and the feed-forward's first products in int8 (its second stays
    float32), a query's vector within INT8_COSINE of float32's for every text (empty, cut at 256
    tokens, other scripts), the same in a batch as alone (no padding in an input's scale); what
    is stored keeps float32."""
    full = encoder.encode(TEXTS)
    try:
        encoder.use_int8()
        assert encoder.query_precision == "int8"
        products = {k.split(".", 3)[3].removesuffix(".int8")
                    for k in encoder._query_layers if k.endswith(".int8")}
        assert products == set(bert._INT8_LAYERS)
        near = encoder.encode(TEXTS, query=True)
        assert np.all(np.sum(full * near, axis=1) >= bert.INT8_COSINE) and not np.array_equal(full, near)
        assert np.array_equal(near, np.stack([encoder.encode([t], query=True)[0] for t in TEXTS]))
        assert np.array_equal(encoder.encode(TEXTS), full)  # the passage path never changes
    finally:
        encoder._query_layers = None


def test_int8_is_refused_when_it_is_not_faster_or_not_close_or_this_torch_has_no_engine(encoder, monkeypatch):
    probes = ("hi", "What did she say about the lighthouse last summer?")
    timed: list[bool] = []  # for each timing: with the trial's layers (True) or float32
    monkeypatch.setattr(bert, "may_compute_bfloat16", lambda torch: False)  # int8's trial alone
    monkeypatch.setattr(encoder, "_cost",
                        lambda text, layers, tries: timed.append(layers is not None) or 1.0)  # no faster
    assert encoder.choose_query_precision(probes) == "float32" and encoder._query_layers is None
    assert timed == [False, True, True, False]  # interleaved
    monkeypatch.setattr(encoder, "_cost", lambda text, layers, tries: 0.1 if layers is not None else 1.0)
    monkeypatch.setattr(bert, "INT8_COSINE", 1.000001)  # never that close
    assert encoder.choose_query_precision(probes) == "float32" and encoder._query_layers is None
    monkeypatch.setattr(bert, "INT8_COSINE", 0.99)
    assert encoder.choose_query_precision(probes) == "int8" == encoder.query_precision
    timed.clear()
    monkeypatch.setattr(encoder, "_cost", lambda text, layers, tries: timed.append(layers is not None) or 0.1)
    monkeypatch.setattr(bert, "may_compute_int8", lambda torch: False)  # no trial, no timing
    assert encoder.choose_query_precision(probes) == "float32"
    assert encoder._query_layers is None and timed == []
    monkeypatch.setattr(bert, "may_compute_int8", lambda torch: True)
    monkeypatch.setattr(encoder, "_int8_layers", lambda: (_ for _ in ()).throw(RuntimeError("no kernel")))
    assert encoder.choose_query_precision(probes) == "float32" and encoder._query_layers is None
    encoder._query_layers = None


def test_int8_is_tried_where_torch_has_a_quantized_engine():
    import torch

    class NoEngine:
        class backends:  # noqa: N801 - torch's attribute names
            class quantized:  # noqa: N801
                supported_engines = ["none"]

        ops = torch.ops

    assert bert.may_compute_int8(NoEngine) is False
    x86 = any(e in torch.backends.quantized.supported_engines for e in ("x86", "fbgemm", "qnnpack"))
    assert bert.may_compute_int8(torch) is x86


def test_a_query_traced_once_gives_the_eager_vectors_to_the_bit(encoder, monkeypatch):
    """trace_query: one query's pass as a TorchScript graph, run with no Python between its
    operations, in any precision, for a text of any length (empty, cut at 256 tokens, other
    scripts): the eager pass's vectors exactly. Batches and what is stored keep the eager pass;
    a change of precision drops the graph."""
    probes = ("hi", "What did she say about the lighthouse last summer?", "word " * 300)
    try:
        for use in (None, encoder.use_half, encoder.use_int8):
            encoder._query_layers = encoder._query_graph = None
            if use is not None:
                use()
            eager = [encoder.encode([text], query=True) for text in TEXTS]
            assert encoder.trace_query(probes) and encoder._query_graph is not None
            with monkeypatch.context() as m:  # the graph alone answers: the eager pass would fail
                m.setattr(encoder, "_forward", lambda *a: (_ for _ in ()).throw(AssertionError("eager")))
                for text, vector in zip(TEXTS, eager):
                    assert np.array_equal(encoder.encode([text], query=True), vector), text
                if use == encoder.use_int8:  # a batch of int8 queries runs text by text, through it
                    assert np.array_equal(encoder.encode(TEXTS[:2], query=True), np.concatenate(eager[:2]))
                else:
                    with pytest.raises(AssertionError, match="eager"):
                        encoder.encode(TEXTS[:2], query=True)
                with pytest.raises(AssertionError, match="eager"):
                    encoder.encode(TEXTS[:1])
        encoder.use_half()
        assert encoder._query_graph is None
        assert encoder.trace_query(probes) and encoder._query_graph is not None
        encoder.use_int8()
        assert encoder._query_graph is None
    finally:
        encoder._query_layers = encoder._query_graph = None


def test_a_query_pass_the_tracer_cannot_follow_or_gives_other_vectors_stays_eager(encoder, monkeypatch):
    import torch

    probes = ("hi", "What did she say about the lighthouse last summer?")
    real_trace = torch.jit.trace
    try:
        monkeypatch.setattr(torch.jit, "trace", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no")))
        assert encoder.trace_query(probes) is False and encoder._query_graph is None

        def off_by_a_bit(module, inputs, **kwargs):
            graph = real_trace(module, inputs, **kwargs)
            return lambda ids: graph(ids) * (1 + 1e-6)

        monkeypatch.setattr(torch.jit, "trace", off_by_a_bit)
        assert encoder.trace_query(probes) is False and encoder._query_graph is None
    finally:
        encoder._query_graph = None


def test_the_packaged_embedder_traces_its_query_pass_once_ready(embedder):
    embedder.settle()
    assert embedder._encoder is not None and embedder._encoder._query_graph is not None
    text = "Where did Ayla hide the lantern before the storm?"
    embedder._cache.clear()
    assert np.array_equal(embedder.embed_one(text, 60, kind="query"),
                          embedder._encoder._pooled(*embedder._encoder._ids([text]),
                                                    embedder._encoder._query_layers).numpy()[0])


def test_bfloat16_is_refused_when_it_is_not_faster_or_not_close(encoder, monkeypatch):
    probes = ("hi", "What did she say about the lighthouse last summer?")
    monkeypatch.setattr(bert, "may_compute_bfloat16", lambda torch: True)  # the trial decides
    monkeypatch.setattr(bert, "may_compute_int8", lambda torch: False)  # bfloat16's trial alone
    monkeypatch.setattr(encoder, "_cost", lambda text, query, tries: 1.0)  # no faster
    assert encoder.choose_query_precision(probes) == "float32" and encoder._query_layers is None
    monkeypatch.setattr(encoder, "_cost", lambda text, query, tries: 0.1 if query else 1.0)
    monkeypatch.setattr(bert, "HALF_COSINE", 1.000001)  # never that close
    assert encoder.choose_query_precision(probes) == "float32" and encoder._query_layers is None
    monkeypatch.setattr(bert, "HALF_COSINE", 0.999)
    assert encoder.choose_query_precision(probes) == "bfloat16" and encoder._query_layers is not None

    def no_kernel(text, query, tries):
        raise RuntimeError('"addmm_impl_cpu_" not implemented for \'BFloat16\'')

    monkeypatch.setattr(encoder, "_cost", no_kernel)  # a torch without bfloat16 kernels: float32
    assert encoder.choose_query_precision(probes) == "float32" and encoder._query_layers is None


def test_an_embedder_with_queries_in_another_precision_caches_a_query_apart_from_the_same_passage(embedder):
    """The last action is embedded as a query, then stored as a message: the stored vector must
    be the float32 one, never the query's from the cache."""
    text = "Ayla lit the lantern on the pier at midnight."
    embedder.settle()  # int8's trial after ready
    embedder._cache.clear()
    query = embedder.embed_one(text, 60, kind="query")
    passage = embedder.embed_one(text, 60, kind="passage")
    assert np.abs(passage - bert_reference(text)).max() < 1e-6
    precision = embedder.status()["query_precision"]
    if precision != "float32":
        assert embedder.distinguishes_kinds and not np.array_equal(query, passage)
        assert float(query @ passage) >= {"bfloat16": bert.HALF_COSINE, "int8": bert.INT8_COSINE}[precision]


def test_int8_is_tried_once_the_model_is_ready_and_a_refusal_caches_queries_with_passages(tmp_path,
                                                                                          monkeypatch):
    """At load only bfloat16 is tried (ready waits for it); int8's trial runs after ready, beside
    the index's build, with queries cached apart from passages from before it starts (an int8
    vector must never be stored as a passage's); refused, they share the cache again."""
    from server_plugin.retrieval import embedders
    from server_plugin.settings import load_settings

    calls = []

    def spy(self, probes, tries=5, kinds=("bfloat16", "int8")):
        calls.append((tuple(kinds), model._ready.is_set(), model.distinguishes_kinds))
        return "float32"

    monkeypatch.setattr(bert.Encoder, "choose_query_precision", spy)
    settings = load_settings({"data_dir": str(tmp_path)}, environ={})
    model = embedders._make(embedders.key_of(settings), settings).start_loading()
    model.wait(180)
    model.settle()
    assert calls == [(("bfloat16",), False, False), (("int8",), True, True)]
    assert not model.distinguishes_kinds and model.status()["query_precision"] == "float32"


def bert_reference(text: str) -> np.ndarray:
    path = packaged_model_path()
    return bert.Encoder(path, bert.layout(path)).encode([text])[0]


def test_the_setting_float32_keeps_every_query_in_float32(tmp_path, embedder):
    """`embed_query_precision = "float32"`: no precision trial at load, a query's vector is the
    stored text's (float32, one cache entry for both), whatever this CPU runs faster; health
    says so. A value other than auto or float32 is refused when the settings load."""
    from server_plugin.retrieval import embedders
    from server_plugin.settings import SettingsError, load_settings

    with pytest.raises(SettingsError, match="embed_query_precision"):
        load_settings({"data_dir": str(tmp_path), "embed_query_precision": "bfloat16"}, environ={})
    settings = load_settings({"data_dir": str(tmp_path), "embed_query_precision": "float32"}, environ={})
    model = embedders._make(embedders.key_of(settings), settings).start_loading()
    model.wait(180)
    assert model.error is None and model._encoder is not None
    assert model.status()["query_precision"] == "float32" and not model.distinguishes_kinds
    text = "Where did Ayla hide the lantern before the storm?"
    query = model.embed_one(text, 60, kind="query")
    model._cache.clear()
    assert np.array_equal(query, model.embed_one(text, 60, kind="passage"))
    assert np.abs(query - bert_reference(text)).max() < 1e-6


def test_no_bfloat16_trial_on_an_x86_cpu_without_avx512(encoder, monkeypatch):
    """An x86 CPU that torch runs without AVX-512 has no bfloat16 instructions: no trial (it
    would time an emulated pass), float32, however the timing would have come out. AVX-512 and
    other architectures are left to the trial."""
    probes = ("hi", "What did she say about the lighthouse last summer?")
    timed: list[bool] = []
    monkeypatch.setattr(encoder, "_cost",
                        lambda text, query, tries: timed.append(query) or (0.1 if query else 1.0))
    monkeypatch.setattr(bert, "HALF_COSINE", 0.999)
    monkeypatch.setattr(bert, "may_compute_bfloat16", lambda torch: False)
    monkeypatch.setattr(bert, "may_compute_int8", lambda torch: False)
    assert encoder.choose_query_precision(probes) == "float32"
    assert encoder._query_layers is None and timed == []
    monkeypatch.undo()

    class Cpu:
        capability = "AVX2"

        class backends:  # noqa: N801 - torch's attribute names
            class cpu:  # noqa: N801
                @staticmethod
                def get_cpu_capability() -> str:
                    return Cpu.capability

    for machine, capability, may in [("x86_64", "AVX2", False), ("AMD64", "DEFAULT", False),
                                     ("x86_64", "AVX512", True), ("aarch64", "DEFAULT", True)]:
        Cpu.capability = capability
        monkeypatch.setattr(bert.platform, "machine", lambda m=machine: m)
        assert bert.may_compute_bfloat16(Cpu) is may, (machine, capability)
