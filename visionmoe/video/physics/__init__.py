"""Physics measured on videos: tracking the moving object (:mod:`.tracking`), fitting laws to
its track (:mod:`.laws`), their differentiable forms (:mod:`.differentiable`) and the rigid-body
projection of a clip onto a law (:mod:`.rigid_body`). Run-time code (the hooks) and the
evaluation both use these; nothing here imports either."""
