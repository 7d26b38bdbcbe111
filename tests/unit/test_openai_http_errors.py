"""HTTP mapping of engine errors. The engine is a stand-in that raises on demand: the real engine's own
overload and validation behaviour is tested in tests/e2e/test_llm_requests.py; here only the API layer is."""

from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from voicepipe.config import load_settings
from voicepipe.llm.errors import ContextOverflowError, OverloadedError
from voicepipe.server import create_app


class RaisingEngine:
    def __init__(self, error):
        self.error = error
        self.tokenizer = None

    def generate(self, *args, **kwargs):
        raise self.error

    complete = generate


@pytest.fixture
def client_with_engine_error():
    def make(error):
        app = create_app(load_settings(), load_models=False)
        app.state.runtime.engine = RaisingEngine(error)
        return TestClient(app)

    return make


BODY = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}]}


def test_overload_is_503_with_retry_after(client_with_engine_error):
    client = client_with_engine_error(OverloadedError("the LLM engine could not admit the request within 1 s."))
    response = client.post("/v1/chat/completions", json=BODY)
    assert response.status_code == 503
    assert int(response.headers["Retry-After"]) >= 1
    assert response.json()["error"]["code"] == "engine_overloaded"


def test_context_overflow_is_400_context_length_exceeded(client_with_engine_error):
    client = client_with_engine_error(ContextOverflowError("the prompt is too long."))
    response = client.post("/v1/completions", json={"model": "smollm2-135m-instruct", "prompt": "hi"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"


def test_requests_before_the_engine_is_loaded_get_503():
    app = create_app(load_settings(), load_models=False)
    response = TestClient(app).post("/v1/chat/completions", json=BODY)
    assert response.status_code == 503 and "Retry-After" in response.headers


def test_malformed_json_body_is_400_in_openai_shape():
    app = create_app(load_settings(), load_models=False)
    app.state.runtime.engine = SimpleNamespace()
    response = TestClient(app).post("/v1/chat/completions", content=b"{not json",
                                    headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_bodies_fastapi_cannot_parse_unknown_paths_and_methods_answer_in_openai_shape_under_v1():
    """Found by schemathesis: a body that is not UTF-8 got FastAPI's {"detail": ...} (an OpenAI client reads
    error.message). Outside /v1 FastAPI's own shape stays."""
    client = TestClient(create_app(load_settings(), load_models=False))
    not_utf8 = client.post("/v1/chat/completions", content=b"\xb7l\xe0t+j",
                           headers={"content-type": "application/json"})
    unknown = client.get("/v1/nothing-here")
    method = client.delete("/v1/models")
    for response, status in ((not_utf8, 400), (unknown, 404), (method, 405)):
        assert response.status_code == status
        assert response.json()["error"]["type"] == "invalid_request_error" and response.json()["error"]["message"]
    assert method.headers["allow"] == "GET"
    assert client.get("/api/calls/x/y/z").json() == {"detail": "Not Found"}
