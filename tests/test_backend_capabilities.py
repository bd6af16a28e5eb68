"""What each backend can do is read once, into Capabilities, from its methods and flags."""

from __future__ import annotations

from types import SimpleNamespace

from onepass.backends.base import Capabilities, capabilities


def test_a_protocol_only_backend_can_do_nothing_more():
    assert capabilities(SimpleNamespace(chat_template=None)) == Capabilities()


def test_methods_and_declared_flags_are_read():
    def method(*_a, **_k):
        return None

    full = SimpleNamespace(step=method, generate=method, embedding_reader=method,
                           render_chat_tools=method, chat_template="{{ x }}",
                           chat_template_kwargs=True, cache_namespaces=True,
                           vocab_statistics=True)
    assert capabilities(full) == Capabilities(
        steps=True, generation_steps=True, generates=True, embeds=True, cache_namespaces=True,
        vocab_statistics=True, template_kwargs=True, tool_templates=True)


def test_a_remote_style_generate_reads_logits_only_and_kwargs_need_a_template():
    scorer = SimpleNamespace(generate=lambda *a, **k: None,
                             chat_template=None, chat_template_kwargs=True)
    can = capabilities(scorer)
    assert can.generates and not can.generation_steps and not can.template_kwargs
    assert not capabilities(SimpleNamespace(step=None)).steps  # an attribute, not a method


def test_the_real_backends_declare_what_the_routes_need(engine):
    """The torch backend (the session's real model) can do everything the routes ask, and
    generates only in its steps: the step scheduler is its one decode loop."""
    assert engine.capabilities == Capabilities(
        steps=True, generation_steps=True, generates=False, embeds=True, scores_prompts=True,
        cache_namespaces=True, vocab_statistics=True, template_kwargs=True, tool_templates=True)


def test_steps_generate_text_without_a_generate_loop():
    stepper = SimpleNamespace(step=lambda *a, **k: None, chat_template=None)
    can = capabilities(stepper)
    assert can.steps and can.generation_steps and not can.generates
