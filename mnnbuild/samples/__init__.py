"""The reference samples the io stage makes: their inputs (`inputs`) and what a model must be to make them
(`checks`). The stage (`mnnbuild.stages.io`) runs the model on them and writes the files."""
