"""PILA's physical categories, the attribute-bank slots each one acts on, and the mappings
from the anchor benchmarks' category names (WISA, PhyGenBench, VideoPhy-2) to ours.

One expert family per category. The taxonomy is deliberately coarse (six categories): a
prompt-level prior must be reliable enough to mask routing, and each category must own a
distinct set of physical relations (residuals) on the attribute bank.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Named field-proxy slots of the physical attribute bank (order = slot index).
#: ``velocity`` and ``acceleration`` are anchored on observable latent motion; the others are
#: built from the anchored ones (see :mod:`visionmoe.video.pila.fields`).
SLOTS: tuple[str, ...] = ("velocity", "acceleration", "density", "pressure", "temperature", "strain", "material")

#: Which slots are directly anchored on observable motion / appearance.
ANCHORED_SLOTS: tuple[str, ...] = ("velocity", "acceleration", "density")


@dataclass(frozen=True)
class Category:
    name: str
    description: str
    slots: tuple[str, ...]  # bank slots this category's experts refine
    residuals: tuple[str, ...]  # names in visionmoe.video.pila.residuals.RESIDUALS that regularise it


CATEGORIES: tuple[Category, ...] = (
    Category(
        "rigid",
        "rigid-body motion, free fall, projectiles, collisions, rolling, sliding",
        ("velocity", "acceleration", "strain", "material"),
        ("trajectory", "rigidity", "gravity"),
    ),
    Category(
        "elastic",
        "elastic and plastic deformation: bouncing balls, cloth, springs, squashing, tearing",
        ("velocity", "acceleration", "strain", "pressure", "material"),
        ("trajectory", "continuity"),
    ),
    Category(
        "liquid",
        "liquid flow: pouring, splashing, waves, dripping, mixing",
        ("velocity", "acceleration", "density", "pressure"),
        ("trajectory", "advection", "continuity", "incompressibility", "gravity"),
    ),
    Category(
        "gas",
        "gas and smoke: rising smoke, steam, wind, explosions' plumes, fog",
        ("velocity", "density", "pressure", "temperature"),
        ("advection", "continuity"),
    ),
    Category(
        "thermal",
        "thermodynamics and phase change: melting, freezing, boiling, burning, evaporation",
        ("density", "temperature", "material"),
        ("heat", "continuity"),
    ),
    Category(
        "optics",
        "light transport: reflection, refraction, shadows, scattering, light sources",
        ("density", "material"),
        ("advection",),
    ),
)

CATEGORY_NAMES: tuple[str, ...] = tuple(c.name for c in CATEGORIES)
NUM_CATEGORIES = len(CATEGORIES)

#: WISA-style physical phenomena (its 17 dynamics / thermodynamics / optics phenomena and
#: the 4 groups) mapped to ours. Keys are lower case.
WISA_TO_PILA: dict[str, tuple[str, ...]] = {
    # groups
    "dynamics": ("rigid", "elastic", "liquid", "gas"),
    "thermodynamics": ("thermal",),
    "optics": ("optics",),
    "object change": ("elastic", "thermal"),
    # dynamics
    "collision": ("rigid",),
    "rigid body motion": ("rigid",),
    "elastic motion": ("elastic",),
    "liquid motion": ("liquid",),
    "gas motion": ("gas",),
    "deformation": ("elastic",),
    # thermodynamics
    "melting": ("thermal", "liquid"),
    "solidification": ("thermal", "liquid"),
    "vaporization": ("thermal", "gas"),
    "liquefaction": ("thermal", "liquid"),
    "explosion": ("thermal", "gas"),
    "combustion": ("thermal", "gas"),
    "sublimation": ("thermal", "gas"),
    "deposition": ("thermal",),
    # optics
    "reflection": ("optics",),
    "refraction": ("optics",),
    "scattering": ("optics",),
    "interference and diffraction": ("optics",),
    "unnatural light source": ("optics",),
}

#: PhyGenBench domains and its physical laws (lower case) mapped to ours.
PHYGENBENCH_TO_PILA: dict[str, tuple[str, ...]] = {
    # domains
    "mechanics": ("rigid", "elastic", "liquid"),
    "optics": ("optics",),
    "thermal": ("thermal",),
    "material": ("thermal", "elastic"),
    "material properties": ("thermal", "elastic"),
    # laws (a representative subset of its 27)
    "gravity": ("rigid",),
    "buoyancy": ("liquid", "rigid"),
    "deformation": ("elastic",),
    "elasticity": ("elastic",),
    "friction": ("rigid",),
    "fluid": ("liquid",),
    "surface tension": ("liquid",),
    "pressure": ("gas", "liquid"),
    "inertia": ("rigid",),
    "reflection": ("optics",),
    "refraction": ("optics",),
    "total internal reflection": ("optics",),
    "diffraction": ("optics",),
    "dispersion": ("optics",),
    "tyndall effect": ("optics", "gas"),
    "melting": ("thermal", "liquid"),
    "solidification": ("thermal",),
    "vaporization": ("thermal", "gas"),
    "sublimation": ("thermal", "gas"),
    "liquefaction": ("thermal", "liquid"),
    "deposition": ("thermal",),
    "combustion": ("thermal", "gas"),
    "explosion": ("thermal", "gas"),
    "dissolution": ("liquid",),
    "color change": ("optics",),
    "hardness": ("rigid", "elastic"),
    "redox": ("thermal",),
}

#: VideoPhy-2 action categories mapped to ours.
VIDEOPHY2_TO_PILA: dict[str, tuple[str, ...]] = {
    "sports and physical activities": ("rigid", "elastic"),
    "object interactions": ("rigid", "elastic", "liquid"),
    "solid-solid": ("rigid",),
    "solid-fluid": ("liquid", "rigid"),
    "fluid-fluid": ("liquid", "gas"),
}


def category_index(name: str) -> int:
    """Index of a category name; raises a ValueError listing the valid names."""
    try:
        return CATEGORY_NAMES.index(name)
    except ValueError:
        raise ValueError(f"unknown physics category {name!r}; expected one of {list(CATEGORY_NAMES)}") from None


def map_external(label: str, source: str = "any") -> tuple[str, ...]:
    """Map an external benchmark label (WISA / PhyGenBench / VideoPhy-2 / ours) to our categories.

    ``source`` is ``"wisa"``, ``"phygenbench"``, ``"videophy2"`` or ``"any"`` (try all, ours first).
    """
    key = label.strip().lower().replace("_", " ")
    if key in CATEGORY_NAMES:
        return (key,)
    tables = {"wisa": (WISA_TO_PILA,), "phygenbench": (PHYGENBENCH_TO_PILA,), "videophy2": (VIDEOPHY2_TO_PILA,)}
    for table in tables.get(source, (WISA_TO_PILA, PHYGENBENCH_TO_PILA, VIDEOPHY2_TO_PILA)):
        if key in table:
            return table[key]
    if source not in (*tables, "any"):
        raise ValueError(f"source must be one of {[*tables, 'any']}, got {source!r}")
    raise ValueError(f"no PILA category for {source} label {label!r}; our categories: {list(CATEGORY_NAMES)}")


def slot_mask(dtype=None):
    """[num_categories, num_slots] 0/1 tensor: which bank slots each category's experts refine."""
    import torch

    m = torch.zeros(NUM_CATEGORIES, len(SLOTS), dtype=dtype or torch.float32)
    for i, c in enumerate(CATEGORIES):
        for s in c.slots:
            m[i, SLOTS.index(s)] = 1
    return m
