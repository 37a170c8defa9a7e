"""Library layers that subclass a quantizable one with a forward of their own, quantized when they compute the
same (checked on a probe), with real library code from a tiny config."""
import pytest
import torch

from workbench import quant


def test_falcon_linears_are_quantized_like_linears():
    """FalconLinear's forward is ``input @ self.weight.T (+ bias)``: it was "a custom forward", so 8 of Falcon's 9
    weight GEMMs stayed float."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.falcon.modeling_falcon import FalconLinear

    config = transformers.FalconConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       new_decoder_architecture=True, num_kv_heads=2, use_cache=False)
    torch.manual_seed(0)
    model = transformers.FalconForCausalLM(config).eval()
    falcon_linears = [name for name, m in model.named_modules() if isinstance(m, FalconLinear)]
    assert len(falcon_linears) == 8
    ids = torch.randint(0, 64, (1, 6))
    with torch.no_grad():
        reference = model(ids).logits
    report = quant.replace_to_quantization_module(model)
    assert report.not_quantizable == []
    assert set(falcon_linears) <= set(report.replaced_names)
    with quant.disable_quantization(model), torch.no_grad():
        assert torch.allclose(model(ids).logits, reference, atol=1e-5)


class _StoresOnSelf(torch.nn.Module):
    """transformers' Switch router: its forward stores the input's dtype on the module before using it."""

    def __init__(self) -> None:
        super().__init__()
        self.classifier = torch.nn.Linear(8, 4)

    def forward(self, hidden_states):
        self.input_dtype = hidden_states.dtype
        return self.classifier(hidden_states).to(self.input_dtype) + hidden_states[..., :4]


def test_a_forward_that_stores_on_self_leaves_no_tracing_proxy_behind():
    """Tracing ran the forward on fx proxies, which stayed on the module: copying the prepared model failed with
    "'node' not in new_dict during proxy unpickling" (switch_transformers at ``new``)."""
    import copy

    import torch.fx as fx

    from workbench.graph import prepare_for_tensorrt

    torch.manual_seed(0)
    x = torch.randn(2, 8)
    inner = torch.nn.Sequential(torch.nn.Linear(8, 8), _StoresOnSelf()).eval()
    prepared, _ = prepare_for_tensorrt(inner, example_inputs=(x,))
    leftovers = [(name, key) for name, m in prepared.named_modules() for key, value in vars(m).items()
                 if isinstance(value, (fx.Proxy, fx.Node))]
    assert leftovers == []
    assert vars(inner[1])["input_dtype"] is torch.float32
    copied = copy.deepcopy(prepared)
    with torch.no_grad():
        assert torch.equal(copied(x), prepared(x))
