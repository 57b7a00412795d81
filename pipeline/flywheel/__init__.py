"""The decision flywheel: served decisions logged, outcomes fed back, harvested into pinned data, drift
watched.

`table` is the inference and feedback tables (Parquet by day, or PostgreSQL); `log` the server's background
writer; `feedback` checks and stores outcomes; `harvest` turns labelled decisions into a new data revision;
`review` lists the decisions a model was least sure of; `drift` compares served traffic with the training
rows.
"""
