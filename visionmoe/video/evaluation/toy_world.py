"""The guarded evaluation on the shipped toy world (:func:`evaluate_toy_world`): generate the same
prompts and noise seeds with the base model and each arm (a PILA adapter, trajectory guidance,
trajectory projection; the scale-0 control), score every clip (:mod:`.scoring`) and summarise
the arms against the base and the simulator (:mod:`.statistics`) into a
:class:`ToyWorldEvaluation` (markdown table, JSON)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .scoring import EvalSettings, score_clip
from .statistics import Summary, summarize

logger = logging.getLogger(__name__)


@dataclass
class Arm:
    """One way of generating: the base model, an adapter, or a fine-tuned transformer.

    ``adapter``: a PILAAdapter or its folder (None: no adapter); ``transformer``: a state
    dict or a ``WanTransformer3DModel`` folder replacing the base transformer's weights;
    ``trajectory_guidance``: the strength of :mod:`.trajectory_guidance` (0: off);
    ``trajectory_projection``: the law of :mod:`.trajectory_projection` (``""``: off), with
    ``projection_strength``, ``projection_steps`` and ``projection_space``.
    """

    name: str
    adapter: Any = None
    scale: float = 1.0
    residual_guidance: float = 0.0
    window: Tuple[float, float] = (0.0, 1.0)
    transformer: Any = None
    trajectory_guidance: float = 0.0
    trajectory_projection: str = ""
    projection_strength: float = 1.0
    projection_steps: int = 1
    projection_space: str = "latent"


@dataclass
class ToyWorldEvaluation:
    settings: Dict[str, Any]
    items: List[Tuple[str, str, str, int]]  # (prompt, colour, motion, noise seed)
    per_clip: Dict[str, List[Dict]]
    summary: Summary
    control_bit_identical: Optional[bool] = None
    clips: Dict[str, List[np.ndarray]] = field(default_factory=dict)  # when keep_clips

    def markdown(self) -> str:
        s = self.settings
        note = (f"\n\n{len(self.items)} clips per arm (noise seeds {s['seed_sets']}), {s['steps']} steps, guidance "
                f"{s['guidance']}. Headlines: failed clips (object lost in more than {100 * (1 - s['min_tracked']):.0f}% "
                "of the frames, still, or undefined) score the worst value observed; means with bootstrap 95% intervals; "
                "changes are paired (same prompt and seed), relative for scores and in points for shares.")
        return self.summary.markdown() + note

    def to_json(self) -> Dict[str, Any]:
        return {"settings": self.settings, "items": self.items, "control_bit_identical": self.control_bit_identical,
                "summary": self.summary.to_json(),
                "per_clip": {k: [{kk: (vv.item() if isinstance(vv, np.generic) else vv) for kk, vv in r.items()}
                                 for r in rows] for k, rows in self.per_clip.items()}}

    def save(self, out_dir: str) -> None:
        """Write ``table.md`` (:meth:`markdown`) and ``results.json`` (:meth:`to_json`, which
        ``ablate_pila.py merge`` pools across seed sets) into ``out_dir``."""
        import json
        import os

        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "table.md"), "w") as fh:
            fh.write(self.markdown() + "\n")
        with open(os.path.join(out_dir, "results.json"), "w") as fh:
            json.dump(self.to_json(), fh, default=float)


def toy_world_items(num: int, seed_base: int) -> List[Tuple[str, str, str, int]]:
    """(prompt, colour, motion, noise seed): prompts cycle through the 6 colours x {bounce, fall}."""
    from ..models.toy_world import TOY_WORLD_COLORS, toy_world_prompt

    out = []
    for i in range(num):
        color = TOY_WORLD_COLORS[i % len(TOY_WORLD_COLORS)]
        motion = ("bounce", "fall")[(i // len(TOY_WORLD_COLORS)) % 2]
        out.append((toy_world_prompt(color, motion), color, motion, seed_base + i))
    return out


def generate_clips(pipe, items, *, steps: int = 20, guidance: float = 3.0, batch: int = 8,
                   progress: Optional[Callable[[int, int], None]] = None) -> List[np.ndarray]:
    """uint8 clips of ``pipe`` for (prompt, _, _, seed) items (noise drawn on the CPU)."""
    import torch

    out = []
    for i in range(0, len(items), batch):
        chunk = items[i:i + batch]
        gens = [torch.Generator().manual_seed(int(it[3])) for it in chunk]
        res = pipe(prompt=[it[0] for it in chunk], negative_prompt=[""] * len(chunk), height=64, width=64,
                   num_frames=17, num_inference_steps=steps, guidance_scale=guidance, generator=gens,
                   output_type="np").frames
        out.extend(np.clip(np.rint(np.asarray(r) * 255), 0, 255).astype(np.uint8) for r in res)
        if progress is not None:
            progress(len(out), len(items))
    return out


def simulator_clips(items) -> List[np.ndarray]:
    """The simulator's own clips for the items' motions (held-out simulation seeds 7000000+)."""
    from ..data.synthetic import generate_clip

    return [generate_clip("bounce" if it[2] == "bounce" else "free_fall", 7_000_000 + i) for i, it in enumerate(items)]


def caption_color(caption: str) -> Optional[str]:
    """The palette colour a caption names (None if none)."""
    from ..data.scenes import COLORS

    return next((w for w in caption.lower().split() if w in COLORS), None)


def _score_with_reference(clips: Dict[str, List[np.ndarray]], items, st: EvalSettings) -> Dict[str, List[Dict]]:
    """Every arm's clips scored against the prompts' colours, and the simulator's reference clips
    (added to ``clips``) against their own: the simulator draws its own colour."""
    sim = simulator_clips(items)
    clips["simulator (reference)"] = [c.frames for c in sim]
    per_clip = {name: [score_clip(fr, it[1], st) for fr, it in zip(cl, items)] for name, cl in clips.items()
                if name != "simulator (reference)"}
    per_clip["simulator (reference)"] = [score_clip(c.frames, caption_color(c.caption), st) for c in sim]
    return per_clip


def evaluate_toy_world(arms: Optional[Sequence[Arm]] = None, *, model=None, num: int = 32,
                       seed_sets: Sequence[int] = (900_000,), steps: int = 20, guidance: float = 3.0, batch: int = 8,
                       device: str = "cpu", control: bool = True, keep_clips: bool = False,
                       settings: Optional[EvalSettings] = None,
                       progress: Optional[Callable[[str, int, int], None]] = None) -> ToyWorldEvaluation:
    """Generate ``num`` clips per seed set and arm on the toy world model and score them (guarded).

    Args:
        arms: what to compare; default: the shipped PILA adapter at scale 1 (when present).
            The base model is always the first arm (``"base"``).
        model: a loaded toy world ``WanPipeline`` or its folder (default: the shipped one).
        seed_sets: noise-seed bases; ``num`` clips each (seeds ``base + i``), pooled.
        control: also run the first adapter arm at scale 0 and check it is bit-identical to the base.
        progress: ``progress(arm, done, total)`` after every batch.
    """
    from ..hooks.pila import attach_pila, detach_pila
    from ..hooks.trajectory_guidance import attach_trajectory_guidance, detach_trajectory_guidance
    from ..hooks.trajectory_projection import attach_trajectory_projection, detach_trajectory_projection
    from ..models.toy_world import load_toy_world, toy_world_adapter_path
    from ..pipelines.wan_pila import load_adapter

    st = settings or EvalSettings()
    pipe = model if model is not None and not isinstance(model, (str,)) and hasattr(model, "transformer") \
        else load_toy_world(model, device=device)
    if arms is None:
        path = toy_world_adapter_path()
        arms = [Arm("PILA (scale 1)", adapter=path)] if path is not None else []
    names = [a.name for a in arms]
    if len(set(names)) != len(names) or "base" in names:
        raise ValueError(f"arm names must be distinct and not 'base', got {names}")
    items = [it for sb in seed_sets for it in toy_world_items(num, sb)]
    base_state = {k: v.detach().clone() for k, v in pipe.transformer.state_dict().items()}

    def cb(name):
        return (lambda d, t: progress(name, d, t)) if progress is not None else None

    gen = dict(steps=steps, guidance=guidance, batch=batch)
    clips = {"base": generate_clips(pipe, items, progress=cb("base"), **gen)}
    same = None
    for arm in arms:
        if arm.transformer is not None:
            sd = arm.transformer
            if isinstance(sd, str):
                from diffusers import WanTransformer3DModel

                sd = WanTransformer3DModel.from_pretrained(sd).state_dict()
            pipe.transformer.load_state_dict(sd)
        try:
            if arm.adapter is not None:
                adapter = load_adapter(arm.adapter).eval()
                if control and same is None:
                    attach_pila(pipe, adapter, scale=0.0)
                    ctl = generate_clips(pipe, items, progress=cb("control (scale 0)"), **gen)
                    same = all(np.array_equal(x, y) for x, y in zip(clips["base"], ctl))
                    logger.info("control (scale 0) bit-identical to the base: %s", same)
                attach_pila(pipe, adapter, scale=arm.scale, residual_guidance=arm.residual_guidance,
                            start=arm.window[0], end=arm.window[1])
            if arm.trajectory_guidance > 0:
                attach_trajectory_guidance(pipe, arm.trajectory_guidance)
            if arm.trajectory_projection:
                attach_trajectory_projection(pipe, arm.projection_steps, arm.trajectory_projection,
                                             arm.projection_strength, arm.projection_space)
            clips[arm.name] = generate_clips(pipe, items, progress=cb(arm.name), **gen)
        finally:
            detach_trajectory_guidance(pipe)
            detach_trajectory_projection(pipe)
            detach_pila(pipe)
            if arm.transformer is not None:
                pipe.transformer.load_state_dict(base_state)
    per_clip = _score_with_reference(clips, items, st)
    summary = summarize(per_clip, "base", "simulator (reference)", st)
    def describe(v):
        return v if v is None or isinstance(v, str) else type(v).__name__

    sets = dict(num=num, seed_sets=list(seed_sets), steps=steps, guidance=guidance, min_tracked=st.min_tracked,
                arms=[dict(name=a.name, adapter=describe(a.adapter), scale=a.scale, residual_guidance=a.residual_guidance,
                           trajectory_guidance=a.trajectory_guidance,
                           window=list(a.window), transformer=describe(a.transformer)) for a in arms])
    return ToyWorldEvaluation(sets, items, per_clip, summary, same, clips if keep_clips else {})


__all__ = ["Arm", "ToyWorldEvaluation", "evaluate_toy_world", "generate_clips", "simulator_clips", "toy_world_items"]
