"""The DAG's machinery, independent of any one stage: the stage declaration, manifests, the artifact layout,
code fingerprints, the artifact cache, resource accounting and the settings that locate specs and artifacts."""
