"""Text generation: a second path through the same backend, not a second engine.

Prompt rendering, the prefix cache and the backend's forward are shared with decisions; this
package adds what generation needs on top of them: the sampler (`sampling`: validated
`SamplingParams` and one documented pipeline of pure functions over a logits row) and text
handling (`text`: incremental detokenization and stop strings, no torch). The decode scheduler
and the OpenAI wire translation live in modules beside these. Nothing is imported here, so
`onepass.generate.text` stays importable without torch.
"""
