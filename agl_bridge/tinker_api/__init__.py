"""A local server of the Tinker training API: the unmodified `tinker` SDK (and tinker-cookbook code) trains
and samples against our `TrainingClient` and in-process sampler, on a CPU or a GPU, offline.

`TinkerServer` runs it in this process (tests, notebooks); `agl-bridge serve-tinker` from the shell.
See docs/tinker.md.
"""
