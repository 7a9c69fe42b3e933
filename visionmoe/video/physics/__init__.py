"""Physics measured on videos: tracking the moving object (:mod:`.tracking`), fitting laws to
its track (:mod:`.laws`), their differentiable forms (:mod:`.differentiable`), the rigid-body
projection of a clip onto a law (:mod:`.rigid_body`) and the check that a clip is within that
projection's assumption, one free body over a static background and camera (:mod:`.domain`).
Run-time code (the hooks) and the evaluation both use these; nothing here imports either."""
