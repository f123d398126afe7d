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

from kdbench.capture import PADDED_KEY_SCORE, FeatureCapture, UnsupportedArchitectureError
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


@pytest.mark.parametrize("arch", sorted(BUILDERS))
def test_captured_scores_softmax_to_the_eager_attention_probabilities(arch):
    torch.manual_seed(0)
    model = BUILDERS[arch]().eval()
    model.set_attn_implementation("eager")
    input_ids, attention_mask = _padded_batch()
    with torch.no_grad(), FeatureCapture(model, EVERYTHING) as capture:
        outputs = model(input_ids=input_ids, attention_mask=attention_mask, output_attentions=True,
                        output_hidden_states=True)
        features = capture.collect(outputs)

    assert len(features.attention_scores) == len(outputs.attentions) == model.config.num_hidden_layers
    for scores, probs, eager in zip(features.attention_scores, features.attention_probs, outputs.attentions):
        torch.testing.assert_close(torch.softmax(scores, -1), eager, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(probs, eager, atol=1e-5, rtol=1e-4)
        # Padded keys carry zero probability; the pre-softmax scores hold TinyBERT's -10000 there.
        padded_keys = attention_mask[:, None, None, :].expand_as(probs) == 0
        assert probs[padded_keys].abs().max() < 1e-6
        assert (scores[padded_keys] < PADDED_KEY_SCORE / 2).all()
        assert (scores[~padded_keys] > PADDED_KEY_SCORE / 2).all()
    for captured, reference in zip(features.hidden_states, outputs.hidden_states):
        torch.testing.assert_close(captured, reference)
    torch.testing.assert_close(features.logits, outputs.logits)


@pytest.mark.parametrize("arch", ["bert", "roberta"])
def test_capture_leaves_sdpa_models_and_their_logits_unchanged(arch):
    torch.manual_seed(0)
    model = BUILDERS[arch]().eval()
    input_ids, attention_mask = _padded_batch()
    with torch.no_grad():
        plain = model(input_ids=input_ids, attention_mask=attention_mask).logits
        with FeatureCapture(model, EVERYTHING) as capture:
            features = capture.collect(model(input_ids=input_ids, attention_mask=attention_mask))
        after = model(input_ids=input_ids, attention_mask=attention_mask).logits
    assert model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(features.logits, plain)
    torch.testing.assert_close(after, plain)
    # Scores are still recomputed correctly from the q/k hooks although SDPA returns no maps.
    model.set_attn_implementation("eager")
    with torch.no_grad():
        eager = model(input_ids=input_ids, attention_mask=attention_mask, output_attentions=True).attentions
    torch.testing.assert_close(features.attention_probs[0], eager[0], atol=1e-5, rtol=1e-4)


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
