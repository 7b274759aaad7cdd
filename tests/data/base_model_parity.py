"""The check both shipped base models pass (tests/data/test_tiny_base.py, test_cot_base.py): the folder
loads with our `load_pretrained` and with transformers' AutoTokenizer / AutoModelForCausalLM, is the
Qwen2 its tokenizer says (vocabulary, EOS, PAD), and gives transformers' logits on `text`."""

import numpy as np


def assert_loads_and_matches_transformers(path, text: str) -> list[int]:
    """The token ids of `text` under the folder's tokenizer, after the checks."""
    import jax.numpy as jnp
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dapo_jax.models.decoder import positions_from_mask
    from dapo_jax.models.hf_io import load_pretrained

    tok = AutoTokenizer.from_pretrained(path)
    model = load_pretrained(path)
    assert model.config.model_type == "qwen2" and model.config.vocab_size == len(tok)
    assert model.config.eos_token_id == (tok.eos_token_id,) and model.config.pad_token_id == tok.pad_token_id
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    x = jnp.asarray([ids], jnp.int32)
    mask = jnp.ones_like(x)
    ours = np.asarray(model.logits(model(x, positions_from_mask(mask), mask)[0]))
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = ref(torch.tensor([ids])).logits.numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)
    return ids
