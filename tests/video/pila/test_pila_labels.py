import pytest
import torch

from visionmoe.video.pila.labels import TextCategoryClassifier, classify_prompt, prior_from_labels, prior_from_logits, resolve_prior
from visionmoe.video.pila.taxonomy import CATEGORY_NAMES, PHYGENBENCH_TO_PILA, WISA_TO_PILA, map_external, slot_mask


@pytest.mark.parametrize(
    "prompt, expected",
    [
        ("A rubber ball bounces on the floor", {"elastic", "rigid"}),
        ("Water pours into a glass and splashes", {"liquid"}),
        ("Smoke rises from a chimney", {"gas"}),
        ("An ice cube melts in the sun", {"thermal"}),
        ("A laser beam refracts through a prism", {"optics"}),
    ],
)
def test_lexicon(prompt, expected):
    prior = classify_prompt(prompt)
    assert prior.source == "lexicon"
    assert set(prior.categories) == expected


def test_no_keyword_is_uniform():
    prior = classify_prompt("a portrait of a person smiling")
    assert prior.source == "uniform" and bool(prior.mask.all())


def test_user_labels_override_and_external_names():
    p = resolve_prior(["liquid", "Combustion"], "a ball falls")
    assert p.source == "user" and set(p.categories) == {"liquid", "thermal", "gas"}
    assert set(prior_from_labels("rigid,optics").categories) == {"rigid", "optics"}
    with pytest.raises(ValueError, match="no PILA category"):
        prior_from_labels(["quantum tunnelling"])


def test_mappings_cover_known_categories():
    for table in (WISA_TO_PILA, PHYGENBENCH_TO_PILA):
        for key, cats in table.items():
            assert cats and set(cats) <= set(CATEGORY_NAMES), key
    assert map_external("rigid body motion", "wisa") == ("rigid",)
    assert map_external("Mechanics", "phygenbench") == ("rigid", "elastic", "liquid")
    m = slot_mask()
    assert m.shape == (len(CATEGORY_NAMES), 7) and bool((m.sum(1) > 0).all())


def test_learned_prior_and_classifier():
    p = prior_from_logits(torch.tensor([3.0, -3, -3, 2, -3, -3]))
    assert p.source == "learned" and set(p.categories) == {"rigid", "gas"}
    assert prior_from_logits(torch.full((6,), -5.0)).mask.sum() == 6  # ties: never an empty mask
    clf = TextCategoryClassifier(32).eval()
    text = torch.randn(2, 7, 32)
    text[:, 4:] = 0  # padding is ignored by pooling
    full = clf(text)
    assert full.shape == (2, 6)
    assert torch.allclose(full, clf(text[:, :4]), atol=1e-6)
    # untrained classifier is ignored by "auto"
    assert resolve_prior("auto", "water pours", learned_logits=full[0], learned_trained=False).source == "lexicon"
    assert resolve_prior("auto", "water pours", learned_logits=full[0], learned_trained=True).source == "learned"
