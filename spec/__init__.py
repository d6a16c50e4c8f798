"""What a deployment is made of, in pure Python: read alike by the control plane (to refuse
at deploy what a replica would refuse), the pool (to inspect and start it) and the runtime
(to run it).

`spec.engine_options` is the engine's options and their one validation;
`spec.architectures` what the runtime serves and which engine options each architecture
takes; `spec.tensor_parallel` the split of a model's heads over ranks; `spec.gguf` and
`spec.gguf_model` a GGUF file's header and the model folder it imports to;
`spec.function_package` a function's thawpool.toml and `spec.function_request` the body
of a call to it. Nothing here imports torch or any thawpool package but `spec` and `wire`.
"""
