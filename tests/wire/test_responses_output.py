"""wire.responses_output: chat answers as response objects, and chat chunks as the typed
events the official openai client's stream reader accumulates into the same response."""
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from openai._models import construct_type_unchecked
from openai._types import omit

from wire.responses_output import ResponseEvents, ResponseHead, conversation_of, output_of, status_of, usage_of

ECHO = {"instructions": None, "tools": [], "tool_choice": "auto", "parallel_tool_calls": True,
        "text": {"format": {"type": "text"}}, "metadata": {}, "store": True}
CALL = {"index": 0, "id": "call_1", "type": "function",
        "function": {"name": "get", "arguments": "{\"city\": \"Paris\"}"}}


def _chunk(content=None, tool_calls=None, finish_reason=None):
    delta = {k: v for k, v in (("content", content), ("tool_calls", tool_calls)) if v is not None}
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}


def test_a_whole_completion_is_a_message_then_its_calls():
    output, finish = output_of({"choices": [{"finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Let me look", "tool_calls": [CALL]}}]})
    assert [item["type"] for item in output] == ["message", "function_call"]
    assert output[0]["content"] == [{"type": "output_text", "text": "Let me look", "annotations": [],
                                     "logprobs": []}]
    assert (output[1]["call_id"], output[1]["name"], output[1]["arguments"]) == (
        "call_1", "get", CALL["function"]["arguments"])
    assert finish == "tool_calls" and status_of(finish) == "completed" and status_of("length") == "incomplete"
    assert conversation_of(output) == [{"role": "assistant", "content": "Let me look", "tool_calls": [
        {"id": "call_1", "type": "function", "function": CALL["function"]}]}]


def test_the_body_is_what_the_openai_client_reads():
    head = ResponseHead("dep", ECHO)
    body = head.body("incomplete", output_of({"choices": [{"message": {"content": "hi"}}]})[0],
                     usage_of(10, 4, 3))
    response = Response.model_validate(body)
    assert response.id.startswith("resp_") and response.output_text == "hi"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert (response.usage.input_tokens, response.usage.input_tokens_details.cached_tokens,
            response.usage.output_tokens, response.usage.total_tokens) == (10, 4, 3, 13)


def test_streamed_events_accumulate_to_the_completed_response_in_order():
    events = ResponseEvents(ResponseHead("dep", ECHO))
    raw = [*events.opening(), *events.chunk(_chunk("Hel")), *events.chunk(_chunk("lo")),
           *events.chunk(_chunk(tool_calls=[CALL], finish_reason="tool_calls")), *events.chunk({"choices": []})]
    closing, response = events.closing(usage_of(5, 0, 7))
    raw += closing
    assert [e["sequence_number"] for e in raw] == list(range(len(raw)))
    assert [e["type"] for e in raw] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    state = ResponseStreamState(input_tools=omit, text_format=omit)
    for event in raw:
        state.handle_event(construct_type_unchecked(type_=ResponseStreamEvent, value=event))
    snapshot = state._ResponseStreamState__current_snapshot
    assert snapshot.output[0].content[0].text == "Hello"
    assert snapshot.output[1].arguments == CALL["function"]["arguments"]
    final = Response.model_validate(response)
    assert final.status == "completed" and final.output_text == "Hello"
    assert [item.type for item in final.output] == ["message", "function_call"]
    assert final.output[1].call_id == "call_1" and final.usage.output_tokens == 7


def test_a_stream_cut_by_max_tokens_ends_incomplete_and_a_break_is_an_error_event():
    events = ResponseEvents(ResponseHead("dep", ECHO))
    events.opening()
    events.chunk(_chunk("a", finish_reason="length"))
    closing, response = events.closing(usage_of(1, 0, 1))
    assert closing[-1]["type"] == "response.incomplete" and response["status"] == "incomplete"
    error = events.error({"error": {"message": "cut", "code": "upstream_error", "param": None}})
    assert (error["type"], error["code"], error["message"]) == ("error", "upstream_error", "cut")
    assert error["sequence_number"] == closing[-1]["sequence_number"] + 1
