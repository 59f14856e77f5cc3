"""own_kernel.transformers: a patched Hugging Face causal LM trains with the same loss and
gradients as the model's own forward, without building logits (tiny random configs, fp32, the
kernels under the Triton interpreter)."""
import ast
import functools
import inspect
import types
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5",
                                   reason="own_kernel.transformers needs transformers >= 5 "
                                          "(the test extra installs it)")

import own_kernel.transformers as hf_patch  # noqa: E402
from own_kernel.transformers import SUPPORTED, patch, unpatch  # noqa: E402

VOCAB, SEQ = 96, 12
TINY = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0,
            # Larger weights than the default 0.02: logits of order 1-10, so that the softcaps
            # and logit scales below change the loss measurably.
            initializer_range=0.3)
# Architecture -> (config class, model class, settings that make its logit transform matter).
ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
    "phi": ("PhiConfig", "PhiForCausalLM", {}),  # lm_head bias
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"final_logit_softcapping": 2.0}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"final_logit_softcapping": 2.0}),
    "cohere": ("CohereConfig", "CohereForCausalLM", {"logit_scale": 0.25}),
    "granite": ("GraniteConfig", "GraniteForCausalLM", {"logits_scaling": 4.0}),
}

TIED = {"gemma", "gemma2", "gemma3", "cohere"}  # these configs tie the head to the embedding


def tiny_model(arch, **overrides):
    config_name, model_name, specific = ARCHS[arch]
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(**{**TINY, **specific, **overrides})
    return getattr(transformers, model_name)(config).float().train()


def batch(seed=1):
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, VOCAB, (2, SEQ), generator=gen)
    labels = input_ids.clone()
    labels[0, 2:5] = -100  # a prompt span
    labels[1, -3:] = -100  # padding at the end
    return input_ids, labels


@pytest.fixture
def spies(monkeypatch):
    """Counts the kernel's calls (and their keywords) in the patch module."""
    calls = []
    kernel = hf_patch.linear_cross_entropy

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(hf_patch, "linear_cross_entropy", spy)
    return calls


def count_lm_head_calls(model):
    calls = []
    model.lm_head.register_forward_hook(lambda *_: calls.append(1))
    return calls


def loss_and_grads(model, **inputs):
    model.zero_grad(set_to_none=True)
    out = model(**inputs)
    out.loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return out, grads


def assert_same(reference, patched):
    (ref_out, ref_grads), (out, grads) = reference, patched
    torch.testing.assert_close(out.loss, ref_out.loss, rtol=1e-5, atol=1e-6)
    assert ref_grads.keys() == grads.keys()
    for name, ref_grad in ref_grads.items():
        assert ref_grad is not None and grads[name] is not None, name
        torch.testing.assert_close(grads[name], ref_grad, rtol=1e-4, atol=1e-6, msg=name)


def test_supported_lists_every_tested_architecture():
    assert sorted(model_name for _, model_name, _ in ARCHS.values()) == list(SUPPORTED)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_patched_loss_and_gradients_match_the_models_own(arch, spies):
    model = tiny_model(arch)
    input_ids, labels = batch()
    cases = [dict(input_ids=input_ids, labels=labels),
             # Trainer with gradient accumulation: a sum over this batch / the items of all.
             dict(input_ids=input_ids, labels=labels, num_items_in_batch=torch.tensor(37))]
    references = [loss_and_grads(model, **case) for case in cases]
    patch(model)
    lm_head_calls = count_lm_head_calls(model)
    for case, reference in zip(cases, references):
        out = loss_and_grads(model, **case)
        assert out[0].logits is None
        assert_same(reference, out)
    assert len(spies) == len(cases) and not lm_head_calls
    assert spies[1]["reduction"] == "sum"
    # Tied: the shared weight's gradient, compared above, sums the head's and the embedding's.
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    assert tied == (arch in TIED)


def test_the_logit_transforms_reach_the_kernel(spies):
    """The softcap and the logit scales matter in the test configs (else the match above would
    not check them), and the kernel receives them."""
    input_ids, labels = batch()
    for arch, setting, off in (("gemma2", "final_logit_softcapping", None),
                               ("cohere", "logit_scale", 1.0),
                               ("granite", "logits_scaling", 1.0)):
        with_transform = tiny_model(arch)(input_ids=input_ids, labels=labels).loss
        without = tiny_model(arch, **{setting: off})(input_ids=input_ids, labels=labels).loss
        assert (with_transform - without).abs() > 1e-2, arch
    model = patch(tiny_model("gemma3"))
    model(input_ids=input_ids, labels=labels)
    assert spies[-1]["softcap"] == 2.0


def test_a_row_of_ignored_labels_and_shift_labels_match(spies):
    model = tiny_model("qwen2")
    input_ids, labels = batch()
    labels[1] = -100
    shift_labels = torch.randint(0, VOCAB, (2, SEQ))
    shift_labels[0, :4] = -100
    cases = [dict(input_ids=input_ids, labels=labels),
             dict(input_ids=input_ids, labels=labels, shift_labels=shift_labels)]
    references = [loss_and_grads(model, **case) for case in cases]
    patch(model)
    for case, reference in zip(cases, references):
        assert_same(reference, loss_and_grads(model, **case))
    assert len(spies) == len(cases)


def test_gradient_checkpointing(spies):
    model = tiny_model("llama")
    # transformers 5.x renames it (gradient_checkpointing_enable is deprecated there)
    enable = (getattr(model, "activation_checkpointing_enable", None)
              or model.gradient_checkpointing_enable)
    enable()
    input_ids, labels = batch()
    reference = loss_and_grads(model, input_ids=input_ids, labels=labels)
    patch(model)
    assert_same(reference, loss_and_grads(model, input_ids=input_ids, labels=labels))
    assert model.model.gradient_checkpointing and len(spies) == 1


def test_without_labels_or_asking_for_logits_the_model_runs_its_own_forward(spies):
    model = tiny_model("gemma2")
    input_ids, labels = batch()
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits
        last = model(input_ids=input_ids, logits_to_keep=1).logits
        patch(model)
        torch.testing.assert_close(model(input_ids=input_ids).logits, logits, rtol=0, atol=0)
        torch.testing.assert_close(model(input_ids=input_ids, logits_to_keep=1).logits, last,
                                   rtol=0, atol=0)
    assert not spies


def test_eval_mode_keeps_the_logits_unless_asked_not_to(spies):
    input_ids, labels = batch()
    model = tiny_model("llama").eval()
    with torch.no_grad():
        reference = model(input_ids=input_ids, labels=labels)
        patch(model)
        out = model(input_ids=input_ids, labels=labels)  # Trainer's evaluation reads the logits
        torch.testing.assert_close(out.logits, reference.logits, rtol=0, atol=0)
        assert not spies
        unpatch(model)
        patch(model, logits_in_eval=False)
        out = model(input_ids=input_ids, labels=labels)
    assert out.logits is None and len(spies) == 1
    torch.testing.assert_close(out.loss, reference.loss, rtol=1e-5, atol=1e-6)


def test_options_reach_the_kernel_and_return_dict_false_gives_a_tuple(spies):
    input_ids, labels = batch()
    model = tiny_model("mistral")
    reference = model(input_ids=input_ids, labels=labels).loss
    patch(model, low_memory=True)
    out = model(input_ids=input_ids, labels=labels, return_dict=False)
    assert isinstance(out, tuple)
    torch.testing.assert_close(out[0], reference, rtol=1e-5, atol=1e-6)
    unpatch(model)
    patch(model, filter_eps="auto")
    model(input_ids=input_ids, labels=labels)
    assert [(c["low_memory"], c["filter_eps"]) for c in spies] == [(True, None), (False, "auto")]


def test_unpatch_restores_the_original():
    model = tiny_model("phi3")
    input_ids, labels = batch()
    reference = loss_and_grads(model, input_ids=input_ids, labels=labels)
    patch(model)
    assert "forward" in model.__dict__
    # Trainer decides from this signature whether to pass num_items_in_batch.
    assert inspect.signature(model.forward) == inspect.signature(type(model).forward.__get__(model))
    unpatch(model)
    assert "forward" not in model.__dict__ and model.forward.__func__ is type(model).forward
    out = loss_and_grads(model, input_ids=input_ids, labels=labels)
    assert out[0].logits is not None
    assert_same(reference, out)


def test_patch_twice_or_unpatch_unpatched_raises():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="not patched"):
        unpatch(model)
    patch(model)
    with pytest.raises(ValueError, match="already patched"):
        patch(model)


def test_unsupported_models_get_a_clear_error():
    mixtral = transformers.MixtralForCausalLM(transformers.MixtralConfig(
        **TINY, num_local_experts=2, num_experts_per_tok=1))  # its forward adds a router loss
    with pytest.raises(ValueError, match="MixtralForCausalLM is not supported.*LlamaForCausalLM"):
        patch(mixtral)

    class CustomLlama(transformers.LlamaForCausalLM):
        def forward(self, *args, **kwargs):
            return super().forward(*args, **kwargs)

    with pytest.raises(ValueError, match="overrides LlamaForCausalLM.forward"):
        patch(CustomLlama(tiny_model("llama").config))
    with pytest.raises(TypeError, match="model: expected"):
        patch(object())
    model = tiny_model("llama")
    model.lm_head = torch.nn.Sequential(model.lm_head)
    with pytest.raises(ValueError, match="lm_head must be a plain"):
        patch(model)
    with pytest.raises(ValueError, match="low_memory"):
        patch(tiny_model("llama"), filter_eps="auto", low_memory=True)
    with pytest.raises(ValueError, match="filter_eps"):
        patch(tiny_model("llama"), filter_eps="exact")


def test_a_forward_signature_the_patch_does_not_know_is_refused(monkeypatch):
    monkeypatch.setattr(hf_patch, "_STOCK_PARAMETERS", hf_patch._STOCK_PARAMETERS[:-2])
    with pytest.raises(ValueError, match="forward takes"):
        patch(tiny_model("llama"))


def test_a_forward_wrapped_after_patching_is_neither_patched_nor_unpatched():
    """accelerate wraps model.forward (functools.wraps copies the patch's marker)."""
    model = patch(tiny_model("llama"))
    patched = model.forward.__func__
    model.forward = types.MethodType(functools.wraps(patched)(
        lambda self, *args, **kwargs: patched(self, *args, **kwargs)), model)
    with pytest.raises(ValueError, match="not patched"):
        unpatch(model)
    with pytest.raises(ValueError, match="replaced on the instance"):
        patch(model)


def test_a_custom_loss_function_is_refused_not_ignored():
    model = patch(tiny_model("llama"))
    model.loss_function = lambda logits, labels, **kwargs: logits.sum()
    input_ids, labels = batch()
    with pytest.raises(ValueError, match="loss_function"):
        model(input_ids=input_ids, labels=labels)


def test_the_module_imports_transformers_lazily():
    """own_kernel needs only torch and triton: transformers is imported inside functions."""
    tree = ast.parse(Path(hf_patch.__file__).read_text())
    top_level = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top_level |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            top_level.add((node.module or "").split(".")[0])
    assert "transformers" not in top_level
    assert top_level <= {"__future__", "functools", "inspect", "types", "dataclasses", "typing",
                         "torch", "triton", "own_kernel"}, top_level
