"""Layer 2 text side: templates, TextClassifier (hand-computed embeddings, caches), max_over_synonyms."""
import copy
import logging
import os

import pytest
import torch

from sparseclip_d2.clip import (
    OPENAI_IMAGENET_TEMPLATES,
    TextClassifier,
    get_templates,
    max_over_synonyms,
    split_synonyms,
    text_cache_dir,
)


def _hand_embeddings(model, tokenizer, synonyms, templates):
    """Per synonym: encode every template one prompt at a time, normalise, average, renormalise."""
    rows = []
    with torch.no_grad():
        for s in synonyms:
            embs = []
            for t in templates:
                e = model.encode_text(tokenizer([t.replace("{}", s)]))[0].double()
                embs.append(e / e.norm())
            m = torch.stack(embs).mean(0)
            rows.append(m / m.norm())
    return torch.stack(rows)


# ---------------------------------------------------------------- templates
def test_openai_templates_equal_open_clip_published_list():
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES as published

    assert len(OPENAI_IMAGENET_TEMPLATES) == 80
    assert list(OPENAI_IMAGENET_TEMPLATES) == [t("{}") for t in published]
    assert get_templates("openai_imagenet") == list(OPENAI_IMAGENET_TEMPLATES)


def test_named_and_file_templates(tmp_path):
    assert get_templates("single") == ["a photo of a {}."]
    assert get_templates("none") == ["{}"]
    f = tmp_path / "t.txt"
    f.write_text("# my prompts\nan image of a {}.\n\n  a {} in the wild.  \n", encoding="utf-8")
    assert get_templates(str(f)) == ["an image of a {}.", "a {} in the wild."]
    bad = tmp_path / "bad.txt"
    bad.write_text("no placeholder\n", encoding="utf-8")
    with pytest.raises(ValueError, match="'no placeholder'.*placeholder"):
        get_templates(str(bad))
    with pytest.raises(ValueError, match=r"unknown prompt template set 'imagenet80'; valid: openai_imagenet, maskclip, single, none, sub_imagenet, or the path"):
        get_templates("imagenet80")


# ---------------------------------------------------------------- synonyms
def test_split_synonyms_and_errors():
    syn, idx = split_synonyms(["person, people ,", "tv monitor", "sky,clouds"])
    assert syn == ["person", "people", "tv monitor", "sky", "clouds"] and idx == [0, 0, 1, 2, 2]
    with pytest.raises(ValueError, match="class 1"):
        split_synonyms(["cat", " , "])
    with pytest.raises(ValueError, match="list of class names"):
        split_synonyms("cat, dog")


def test_max_over_synonyms_matches_loop():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 3, 4, generator=g)
    index = torch.tensor([0, 0, 2, 1, 2])
    out = max_over_synonyms(logits, index, 3, dim=1)
    assert out.shape == (2, 3, 3, 4)
    for c in range(3):
        ref = logits[:, [s for s in range(5) if index[s] == c]].max(dim=1).values
        assert torch.equal(out[:, c], ref)
    out_last = max_over_synonyms(logits.movedim(1, -1), index, 3, dim=-1)
    assert torch.equal(out_last, out.movedim(1, -1))
    with pytest.raises(ValueError, match=r"\(5,\)"):
        max_over_synonyms(logits, index[:4], 3)
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        max_over_synonyms(logits, index, 2)


# ---------------------------------------------------------------- TextClassifier
@pytest.mark.parametrize("templates", ["single", "openai_imagenet"])
def test_classifier_equals_hand_computation(tiny_clip, templates):
    model, tokenizer, name = tiny_clip
    clf = TextClassifier(model, tokenizer, templates, model_name=name, batch_size=7)
    emb, index = clf(["cat, kitty", "dog"])
    assert emb.dtype == torch.float32 and emb.shape == (3, 32)
    assert index.tolist() == [0, 0, 1] and index.dtype == torch.long
    ref = _hand_embeddings(model, tokenizer, ["cat", "kitty", "dog"], get_templates(templates))
    torch.testing.assert_close(emb.double(), ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(emb.norm(dim=1), torch.ones(3))


def test_batch_size_does_not_change_results(tiny_clip):
    model, tokenizer, name = tiny_clip
    a, _ = TextClassifier(model, tokenizer, "openai_imagenet", batch_size=1000)(["a", "b, c"])
    b, _ = TextClassifier(model, tokenizer, "openai_imagenet", batch_size=3)(["a", "b, c"])
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def _count_calls(monkeypatch, model):
    calls = []
    original = model.encode_text

    def counting(tokens, *args, **kwargs):
        calls.append(tokens.shape[0])
        return original(tokens, *args, **kwargs)

    monkeypatch.setattr(model, "encode_text", counting)
    return calls


def test_memory_cache(tiny_clip, monkeypatch):
    model, tokenizer, name = tiny_clip
    calls = _count_calls(monkeypatch, model)
    clf = TextClassifier(model, tokenizer, "single", model_name=name)
    assert clf.cache_dir is None  # the test conftest disables the disk cache
    e1, _ = clf(["cat", "dog"])
    n = len(calls)
    e2, _ = clf(["cat", "dog"])
    assert len(calls) == n and torch.equal(e1, e2)
    clf(["dog", "cat"])  # another vocabulary
    assert len(calls) > n


def test_disk_cache(tiny_clip, monkeypatch, tmp_path):
    monkeypatch.delenv("SPARSECLIP_TEXT_CACHE", raising=False)
    model, tokenizer, name = tiny_clip
    calls = _count_calls(monkeypatch, model)
    e1, _ = TextClassifier(model, tokenizer, "single", model_name=name, cache_dir=str(tmp_path))(["cat", "dog"])
    files = os.listdir(tmp_path)
    assert len(files) == 1 and files[0].startswith(name) and calls
    calls.clear()
    e2, i2 = TextClassifier(model, tokenizer, "single", model_name=name, cache_dir=str(tmp_path))(["cat", "dog"])
    assert not calls and torch.equal(e1, e2) and i2.tolist() == [0, 1]
    # other templates, other vocabulary, other weights -> new entries
    TextClassifier(model, tokenizer, "none", model_name=name, cache_dir=str(tmp_path))(["cat", "dog"])
    TextClassifier(model, tokenizer, "single", model_name=name, cache_dir=str(tmp_path))(["cat"])
    assert len(os.listdir(tmp_path)) == 3
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.text_projection.mul_(2.0)
    calls.clear()
    TextClassifier(other, tokenizer, "single", model_name=name, cache_dir=str(tmp_path))(["cat", "dog"])
    assert len(os.listdir(tmp_path)) == 4
    # "off" disables, as does the environment variable
    off_dir = tmp_path / "off-test"
    assert text_cache_dir("off") is None
    monkeypatch.setenv("SPARSECLIP_TEXT_CACHE", "off")
    assert text_cache_dir(str(off_dir)) is None
    TextClassifier(model, tokenizer, "single", cache_dir=str(off_dir))(["cat"])
    assert not off_dir.exists()
    monkeypatch.setenv("SPARSECLIP_TEXT_CACHE", str(tmp_path / "env"))
    assert text_cache_dir(None) == str(tmp_path / "env")


def test_long_captions_warn(tiny_clip, caplog):
    model, tokenizer, _ = tiny_clip
    long_caption = " ".join(["red"] * 100)
    with caplog.at_level(logging.WARNING, logger="sparseclip_d2.clip.text"):
        emb, _ = TextClassifier(model, tokenizer, "none")([long_caption, "short"])
    assert "truncated" in caplog.text and "1 prompt" in caplog.text
    assert torch.isfinite(emb).all()


def test_bad_templates_and_batch_size(tiny_clip):
    model, tokenizer, _ = tiny_clip
    with pytest.raises(ValueError, match="placeholder"):
        TextClassifier(model, tokenizer, ["a photo"])
    with pytest.raises(ValueError, match="batch_size"):
        TextClassifier(model, tokenizer, "single", batch_size=0)


def test_memory_cache_is_bounded(tiny_clip, monkeypatch):
    """The in-memory cache is an LRU of ``memory_size`` vocabularies; 0 keeps none (the META_ARCHs
    hold the one cache themselves)."""
    model, tokenizer, name = tiny_clip
    calls = _count_calls(monkeypatch, model)
    clf = TextClassifier(model, tokenizer, "single", model_name=name, memory_size=1)
    clf(["cat"])
    clf(["dog"])  # evicts ["cat"]
    n = len(calls)
    clf(["cat"])
    assert len(calls) > n
    none = TextClassifier(model, tokenizer, "single", model_name=name, memory_size=0)
    none(["cat"])
    n = len(calls)
    none(["cat"])
    assert len(calls) > n
    with pytest.raises(ValueError, match="memory_size"):
        TextClassifier(model, tokenizer, "single", memory_size=-1)
