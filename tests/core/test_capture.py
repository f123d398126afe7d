"""The one feature-capture mechanism against the models' own eager attention, on padded batches."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    DistilBertConfig,
    DistilBertForSequenceClassification,
    MobileBertConfig,
    MobileBertForSequenceClassification,
    RobertaConfig,
    RobertaForSequenceClassification,
)

from kdbench.capture import ATTENTION_FUNCTION, PADDED_KEY_SCORE, FeatureCapture, UnsupportedArchitectureError
from kdbench.features import FeatureRequest

EVERYTHING = FeatureRequest(hidden_states=True, attention_scores=True, attention_probs=True)


def _bert():
    return BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=3,
                                                    num_attention_heads=4, intermediate_size=37, num_labels=2))


def _roberta():
    return RobertaForSequenceClassification(RobertaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                                                          num_attention_heads=4, intermediate_size=37,
                                                          max_position_embeddings=40, pad_token_id=1))


def _distilbert():
    return DistilBertForSequenceClassification(DistilBertConfig(vocab_size=50, dim=32, n_layers=2, n_heads=4,
                                                                hidden_dim=37))


def _mobilebert():
    return MobileBertForSequenceClassification(MobileBertConfig(
        vocab_size=50, hidden_size=32, embedding_size=16, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=24, intra_bottleneck_size=16, true_hidden_size=16, num_feedforward_networks=2))


BUILDERS = {"bert": _bert, "roberta": _roberta, "distilbert": _distilbert, "mobilebert": _mobilebert}


def _padded_batch():
    torch.manual_seed(0)
    input_ids = torch.randint(5, 50, (3, 9))
    attention_mask = torch.ones(3, 9, dtype=torch.long)
    attention_mask[1, 6:] = 0  # padded rows of different lengths
    attention_mask[2, 3:] = 0
    return input_ids, attention_mask


def _eager_reference(model, input_ids, attention_mask):
    """The model's own eager attention maps, hidden states and logits (no capture installed)."""
    model.set_attn_implementation("eager")
    with torch.no_grad():
        outputs = model(input_ids=input_ids, attention_mask=attention_mask, output_attentions=True,
                        output_hidden_states=True)
    model.set_attn_implementation("sdpa")
    return outputs


@pytest.mark.parametrize("arch", sorted(BUILDERS))
def test_captured_scores_softmax_to_the_eager_attention_probabilities(arch):
    torch.manual_seed(0)
    model = BUILDERS[arch]().eval()
    input_ids, attention_mask = _padded_batch()
    eager = _eager_reference(model, input_ids, attention_mask)
    with torch.no_grad():
        plain = model(input_ids=input_ids, attention_mask=attention_mask).logits  # the model's own SDPA
        with FeatureCapture(model, EVERYTHING) as capture:
            assert model.config._attn_implementation == ATTENTION_FUNCTION
            features = capture.collect(model(input_ids=input_ids, attention_mask=attention_mask))
    assert model.config._attn_implementation == "sdpa"  # given back on removal

    assert len(features.attention_scores) == len(eager.attentions) == model.config.num_hidden_layers
    for scores, probs, reference in zip(features.attention_scores, features.attention_probs, eager.attentions):
        torch.testing.assert_close(torch.softmax(scores, -1), reference, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(probs, reference, atol=1e-5, rtol=1e-4)
        # Padded keys carry zero probability; the pre-softmax scores hold TinyBERT's -10000 there.
        padded_keys = attention_mask[:, None, None, :].expand_as(probs) == 0
        assert probs[padded_keys].abs().max() < 1e-6
        assert (scores[padded_keys] < PADDED_KEY_SCORE / 2).all()
        assert (scores[padded_keys] > PADDED_KEY_SCORE * 1.5).all()  # -10000 + q.k, not the dtype's minimum
        assert (scores[~padded_keys] > PADDED_KEY_SCORE / 2).all()
    for captured, reference in zip(features.hidden_states, eager.hidden_states):
        torch.testing.assert_close(captured, reference)
    torch.testing.assert_close(features.logits, eager.logits, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(features.logits, plain, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", sorted(BUILDERS))
def test_only_the_requested_layers_are_recorded_and_the_others_keep_sdpa(arch, monkeypatch):
    import kdbench.capture as capture_module

    torch.manual_seed(0)
    model = BUILDERS[arch]().eval()
    input_ids, attention_mask = _padded_batch()
    eager = _eager_reference(model, input_ids, attention_mask)
    sdpa_calls = []
    original_sdpa = capture_module.sdpa_attention_forward

    def counting_sdpa(*args, **kwargs):
        sdpa_calls.append(args[0])
        return original_sdpa(*args, **kwargs)

    monkeypatch.setattr(capture_module, "sdpa_attention_forward", counting_sdpa)
    last = model.config.num_hidden_layers - 1
    request = FeatureRequest(hidden_states=True, attention_scores=True, hidden_layers=(0, last + 1),
                             attention_layers=(last,))
    with torch.no_grad(), FeatureCapture(model, request) as capture:
        features = capture.collect(model(input_ids=input_ids, attention_mask=attention_mask))
    assert [s is not None for s in features.attention_scores] == [False] * last + [True]
    assert [h is not None for h in features.hidden_states] == [True] + [False] * last + [True]
    assert len(sdpa_calls) == last  # every layer but the recorded one ran SDPA
    torch.testing.assert_close(torch.softmax(features.attention_scores[last], -1), eager.attentions[last],
                               atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(features.hidden_states[-1], eager.hidden_states[-1])
    torch.testing.assert_close(features.logits, eager.logits, atol=1e-5, rtol=1e-4)


def test_captured_scores_carry_gradients_in_training_mode():
    """A student's scores are part of its graph: the attention loss trains q and k."""
    torch.manual_seed(0)
    model = _bert().train()
    input_ids, attention_mask = _padded_batch()
    with FeatureCapture(model, FeatureRequest(attention_scores=True)) as capture:
        features = capture.collect(model(input_ids=input_ids, attention_mask=attention_mask))
    features.attention_scores[0].pow(2).mean().backward()
    query = model.bert.encoder.layer[0].attention.self.query.weight
    assert query.grad is not None and query.grad.abs().sum() > 0


def test_models_without_a_capture_keep_sdpa_and_the_function_falls_back_to_it():
    torch.manual_seed(0)
    captured, bystander = _bert().eval(), _bert().eval()
    input_ids, attention_mask = _padded_batch()
    with torch.no_grad(), FeatureCapture(captured, EVERYTHING):
        before = bystander(input_ids=input_ids, attention_mask=attention_mask).logits
        assert bystander.config._attn_implementation == "sdpa"
        # Run without a recorder (e.g. a model switched to the function by hand): plain SDPA, padding honoured.
        bystander.set_attn_implementation(ATTENTION_FUNCTION)
        after = bystander(input_ids=input_ids, attention_mask=attention_mask).logits
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-4)


def test_only_requested_features_are_captured_and_hooks_are_removed():
    model = _bert().eval()
    input_ids, attention_mask = _padded_batch()
    with torch.no_grad(), FeatureCapture(model, FeatureRequest(hidden_states=True)) as capture:
        features = capture.collect(model(input_ids=input_ids, attention_mask=attention_mask))
    assert features.attention_scores is None and features.attention_probs is None
    assert len(features.hidden_states) == 4  # embeddings + 3 layers
    assert [h.shape for h in features.cls] == [torch.Size([3, 32])] * 4
    torch.testing.assert_close(features.attention_mask, attention_mask)
    hooked = [m for m in model.modules() if m._forward_hooks or m._forward_pre_hooks]
    assert hooked == []


def test_unknown_architecture_is_refused_by_name():
    class Plain(torch.nn.Module):
        config = type("Config", (), {"model_type": "lstm"})()

    with pytest.raises(UnsupportedArchitectureError, match="'lstm'"):
        FeatureCapture(Plain(), FeatureRequest(hidden_states=True))
