"""Guarded evaluation of physics in generated clips (the toy world and any one-object clips).

Three headline scores per arm, each read next to its guards:

- ``gravity_residual`` (px, lower is better): RMS residual of piecewise parabolas with one
  shared acceleration fitted to the object's height (:func:`visionmoe.video.physics.laws.gravity_fit`) on the
  contrast-independent track of :func:`metrics.guarded_track`.
- ``jerk_rel`` (1/frame^2, lower is better): the scale-free jerk of that track
  (:func:`.metrics.scale_free_jerk`).
- ``trajectory_distance`` (lower is better): the energy distance between the arm's tracks
  (the whole ``[F, 2]`` track relative to its start, in frame heights; frames without the
  object a frame height away) and the simulator's: a distance to the distribution of
  physical trajectories, not a lower-is-better score a still or faint object could game.

**Failures are never dropped.** A clip fails when its object is lost (found in fewer than
``min_tracked`` of the frames), does not move (vertical range under 3 px), stalls
(4 consecutive frame steps slower than 0.25 px/frame), a headline is undefined, or it has
fewer frames than the base arm's clip of the same prompt and seed. Every arm reports its failure rate; a failed clip scores the worst value observed
for that headline over all arms and clips of the evaluation (and the descriptor of a still,
absent object in the distance), so a vanished ball costs the arm instead of leaving the
comparison.

Guards (reported with every headline; the goal is "within 5% of the base"): ``fg_area``
(px), ``contrast`` (peak deviation from the background, [0, 1]), ``frames_tracked``,
``objects_per_frame``, ``flicker`` and ``color_ok`` (the moving object has the captioned
colour). The VAE round-trip error is not a quality claim (it rewards small faint blobs: the
simulator's own clips score worse on it than generated ones) and is not computed.

:func:`evaluate_toy_world` generates the arms on the shipped toy world model and returns a
:class:`ToyWorldEvaluation` (markdown table, JSON); :func:`score_clip` and :func:`summarize`
serve any set of clips (``scripts/eval_physics.py``).

Modules: :mod:`.metrics` (the CPU proxies), :mod:`.controls` (negative controls),
:mod:`.scoring` (one clip: headlines, guards, failure), :mod:`.statistics` (arms against the base
and the simulator), :mod:`.toy_world` (the evaluation on the toy world), :mod:`.benchmarks`
(PhyGenBench and VideoPhy-2 exports), :mod:`.law_params` (the deficit world's per-category law
fits) and :mod:`.law_judge` (its independent judge of lawful motion). The names below are this
package's API.
"""

from .scoring import DISTANCE, GUARDS, HEADLINES, SHARES, EvalSettings, object_color, score_clip, track_shape
from .statistics import (ArmSummary, Change, Stat, Summary, energy_distance, paired_change,
                         summarize, trajectory_distance, worst_values)
from .toy_world import Arm, ToyWorldEvaluation, evaluate_toy_world, generate_clips, simulator_clips, toy_world_items

__all__ = ["Arm", "ArmSummary", "Change", "DISTANCE", "EvalSettings", "GUARDS", "HEADLINES", "SHARES", "Stat", "Summary",
           "ToyWorldEvaluation", "energy_distance", "evaluate_toy_world", "generate_clips", "object_color",
           "paired_change", "score_clip", "simulator_clips", "summarize", "toy_world_items", "track_shape",
           "trajectory_distance", "worst_values"]
