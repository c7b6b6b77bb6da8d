"""The text-embedding cache's file name holds everything that changes the embeddings: a change in a
middle layer of the text tower, another tokenizer (context length) or another dtype gets its own
file; the same inputs find the same file."""
import copy

import torch

from sparseclip_d2.clip import TextClassifier


def _path(model, tokenizer, name, cache_dir, synonyms=("cat", "dog")):
    return TextClassifier(model, tokenizer, "single", model_name=name, cache_dir=str(cache_dir))._disk_path(
        list(synonyms))


def test_cache_key_changes_with_what_changes_the_result(tiny_clip, tmp_path, monkeypatch):
    monkeypatch.delenv("SPARSECLIP_TEXT_CACHE", raising=False)  # the suite turns the cache off
    model, tokenizer, name = tiny_clip
    base = _path(model, tokenizer, name, tmp_path)
    assert base is not None
    assert base == _path(copy.deepcopy(model), tokenizer, name, tmp_path)  # same inputs, same file
    middle = copy.deepcopy(model)
    blocks = middle.transformer.resblocks
    with torch.no_grad():  # a middle block of the text tower, not the first or last parameters
        next(blocks[len(blocks) // 2].parameters()).add_(1e-3)
    assert _path(middle, tokenizer, name, tmp_path) != base
    other_tok = copy.copy(tokenizer)
    other_tok.context_length = tokenizer.context_length - 1
    assert _path(model, other_tok, name, tmp_path) != base
    assert _path(copy.deepcopy(model).double(), tokenizer, name, tmp_path) != base
    assert _path(model, tokenizer, name, tmp_path, ("cat", "dogs")) != base
