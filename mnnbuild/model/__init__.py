"""What a model is: the build spec, the target SoCs, the model directory's files and a visual encoder's inputs."""
