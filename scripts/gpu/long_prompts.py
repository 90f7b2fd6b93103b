"""N distinct long-generation prompts as a kvqual suite (JSONL on stdout), for the audit measured on the GPU host
(docs/audit.md): each asks for a long essay, so a small instruct model writes up to max_tokens.

    python3 scripts/gpu/long_prompts.py 2000 1024 > prompts.jsonl
"""

import itertools
import json
import sys

TOPICS = ("rivers", "bridges", "libraries", "volcanoes", "bees", "lighthouses", "glaciers", "markets", "trains",
          "forests", "deserts", "harbors", "clocks", "gardens", "museums", "comets", "coral reefs", "windmills",
          "castles", "islands", "caves", "kites", "maps", "bicycles", "orchards", "storms", "telescopes", "ferries",
          "mountains", "bakeries", "canals", "fireflies", "printing presses", "salt", "silk", "tea", "paper",
          "glass", "copper", "wool", "honey", "rice", "chess", "music boxes", "satellites", "submarines", "owls",
          "whales", "mushrooms", "snow")
ANGLES = ("their history", "how they work", "why people love them", "their future", "their role in cities",
          "what children learn from them", "their place in old stories", "how they changed trade", "their science",
          "the people who study them", "a day spent among them", "their dangers", "their beauty",
          "how to care for them", "their economics", "how they are made", "their symbols in art", "famous examples",
          "common mistakes about them", "their effect on the weather", "their sounds", "their colors",
          "their smallest parts", "how they are measured", "their rivals", "myths about them", "their seasons",
          "what they teach about patience", "how travellers see them", "their records and extremes",
          "their names in other languages", "how they are photographed", "their smell", "their neighbours",
          "how they began", "how they end", "their rules", "their tools", "their maps", "their music")


def main() -> int:
    n, max_tokens = int(sys.argv[1]), int(sys.argv[2])
    pairs = list(itertools.product(TOPICS, ANGLES))
    if n > len(pairs):
        sys.exit(f"at most {len(pairs)} distinct prompts")
    for i, (topic, angle) in enumerate(pairs[:n]):
        text = (f"Write a long, detailed essay of at least 1,500 words about {topic}, focusing on {angle}. "
                "Use many paragraphs and concrete examples.")
        print(json.dumps({"id": f"long{i:04d}", "messages": [{"role": "user", "content": text}],
                          "max_tokens": max_tokens, "category": topic}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
