"""Exercises every operation of amble's OpenAPI document against a running
server and checks each answer against the document (tests/it/api.rs runs
it; Debian's python3-jsonschema).

Usage: openapi_check.py BASE_URL KEY ROOM SUB
The server must have members in ROOM, one of them of user SUB. Every
operation is called with its documented example (path parameters ROOM and
SUB), then without the key; each answer's status must be documented for
that operation and its body must validate against the documented schema.
Prints one line per call; exits 1 on the first mismatch.
"""

import json
import sys
import urllib.error
import urllib.request

import jsonschema

BASE, KEY, ROOM, SUB = sys.argv[1:5]

# An order in which each call still finds what it acts on: listings and
# messages first, the removals last.
ORDER = [
    "openapi", "rooms", "members", "user", "message_room", "message_user",
    "mute", "unmute", "kick", "ban", "unban", "close_room",
]


def call(method, path, body=None, key=True):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(BASE + path, data=data, method=method)
    if key:
        request.add_header("Authorization", "Bearer " + KEY)
    if body is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def check(doc, op, method, path, status, body):
    responses = op["responses"]
    if str(status) not in responses:
        sys.exit(f"{method} {path}: status {status} is not documented ({sorted(responses)})")
    schema = responses[str(status)]["content"]["application/json"]["schema"]
    resolver = jsonschema.RefResolver.from_schema(doc)
    try:
        jsonschema.Draft202012Validator(schema, resolver=resolver).validate(body)
    except jsonschema.ValidationError as error:
        sys.exit(f"{method} {path} -> {status}: the body breaks the document: {error.message}\n{body}")
    print(f"ok {method} {path} -> {status}")


def main():
    status, doc = call("GET", "/api/v1/openapi.json")
    if status != 200:
        sys.exit(f"GET /api/v1/openapi.json -> {status}")
    with open(sys.argv[5] if len(sys.argv) > 5 else "src/api/openapi.json") as f:
        if json.load(f) != doc:
            sys.exit("the served document is not src/api/openapi.json")
    jsonschema.Draft202012Validator.check_schema({"$defs": doc["components"]["schemas"]})
    ops = {}
    for path, item in doc["paths"].items():
        for method, op in item.items():
            ops[op["operationId"]] = (method.upper(), path, op)
    if sorted(ops) != sorted(ORDER):
        sys.exit(f"the document's operations {sorted(ops)} are not the ones checked {sorted(ORDER)}")
    for name in ORDER:
        method, template, op = ops[name]
        path = template.replace("{room}", ROOM).replace("{sub}", SUB)
        body = None
        if "requestBody" in op:
            body = op["requestBody"]["content"]["application/json"]["example"]
            if name == "kick":
                body = dict(body, sub=SUB)
        status, answer = call(method, path, body)
        if status != 200:
            sys.exit(f"{method} {path} with its example -> {status}: {answer}")
        check(doc, op, method, path, status, answer)
        status, answer = call(method, path, body, key=False)
        if status != 401:
            sys.exit(f"{method} {path} without the key -> {status}, not 401")
        check(doc, op, method, path, status, answer)
        if "{room}" in template:
            bad = template.replace("{room}", "no%20spaces").replace("{sub}", SUB)
            status, answer = call(method, bad, body)
            if status != 400:
                sys.exit(f"{method} {bad} -> {status}, not 400")
            check(doc, op, method, bad, status, answer)
        if body is not None:
            status, answer = call(method, path, {"unknown": 1})
            if status != 400:
                sys.exit(f"{method} {path} with an unknown field -> {status}, not 400")
            check(doc, op, method, path, status, answer)
    status, answer = call("GET", "/api/v1/nothing-here")
    if status != 404 or "error" not in answer:
        sys.exit(f"an unknown operation -> {status} {answer}")
    print("every operation answers as the document says")


main()
