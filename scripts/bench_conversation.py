"""Later turns of a conversation through /v1/responses, against a running fleet (start it with `--session-ttl`):
time to the first token when each turn sends only its new input with `previous_response_id` (the fleet keeps the
conversation and, for the session, its KV) vs when each turn re-sends the whole conversation as input items (no
session named). Same conversations, alternating, same run; prints p50 TTFT of turns 2.. and their ratio.

    python scripts/bench_conversation.py --url http://127.0.0.1:8700 [--conversations 6] [--turns 5]
"""

import argparse
import statistics
import time

import openai

CONTEXT = "Notes on the trip so far: " + "We walked along the river, saw the old bridge and ate at the market. " * 30


def first_token_s(client: openai.OpenAI, **request: object) -> tuple[float, str, str]:
    """(seconds to the first text delta, the whole text, the response id) of one streamed turn."""
    start = time.perf_counter()
    first, text, response_id = 0.0, "", ""
    for event in client.responses.create(stream=True, **request):  # type: ignore[call-overload]
        if event.type == "response.output_text.delta":
            first = first or time.perf_counter() - start
            text += event.delta
        elif event.type in ("response.completed", "response.incomplete"):
            response_id = event.response.id
    return first, text, response_id


def conversation(client: openai.OpenAI, model: str, turns: int, tag: int, chained: bool) -> list[float]:
    """TTFT of turns 2.. of one conversation."""
    history: list[dict] = []
    previous = None
    ttfts = []
    for turn in range(turns):
        said = f"{CONTEXT if turn == 0 else ''}Conversation {tag}, question {turn}: where next?"
        item = {"role": "user", "content": said}
        request = {"model": model, "instructions": "Be brief.", "max_output_tokens": 16, "temperature": 0}
        if chained:
            request |= {"input": [item], **({"previous_response_id": previous} if previous else {})}
        else:
            request |= {"input": [*history, item], "store": False}
        seconds, text, previous = first_token_s(client, **request)
        history += [item, {"role": "assistant", "content": text}]
        if turn:
            ttfts.append(seconds)
    return ttfts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8700")
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--turns", type=int, default=5)
    args = parser.parse_args()
    client = openai.OpenAI(base_url=f"{args.url}/v1", api_key="unused", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    chained, resent = [], []
    for tag in range(args.conversations):
        chained += conversation(client, model, args.turns, 2 * tag, chained=True)
        resent += conversation(client, model, args.turns, 2 * tag + 1, chained=False)
    p50_chained, p50_resent = statistics.median(chained), statistics.median(resent)
    print(f"{model}: {args.conversations} conversations of {args.turns} turns each way")
    print(f"later-turn TTFT p50: previous_response_id {1e3 * p50_chained:.0f} ms, re-sent conversation "
          f"{1e3 * p50_resent:.0f} ms, ratio {p50_chained / p50_resent:.2f}")


if __name__ == "__main__":
    main()
