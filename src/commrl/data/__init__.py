"""Datasets: MATH, MATH500, DeepScaleR and the toy task, normalised to verl's parquet schema."""
