import base64
import json
import logging
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from marl_cli.config.errors import ConfigError
from marl_cli.config.paths import config_dir
from marl_cli.config.schema import ResearchConfig, ResearchSourceConfig, WebSearchConfig
from marl_cli.envs import build_env
from marl_cli.envs.research import Hop, ResearchEnv, ResearchState, ResearchTask
from marl_cli.envs.research_data import load_questions
from marl_cli.envs.research_kb import ORG_SUFFIXES, RELATIONS, KnowledgeBase, fts_query
from marl_cli.envs.web_search import WebSearch, html_to_text
from marl_cli.plugins import register_configs


def make_env(seed: int = 0, **kw) -> ResearchEnv:
    return ResearchEnv(ResearchConfig(**kw), seed)


def words(kb: KnowledgeBase) -> list[str]:
    return [w.lower() for e in kb.entities for w in e.name.split() if w not in ORG_SUFFIXES]


def subject_of(hop: Hop) -> str:
    return hop.subtask.split(" of ", 1)[1]


# --- knowledge base --------------------------------------------------------------------------------


def test_generation_is_deterministic():
    a, b = make_env(seed=3), make_env(seed=3)
    assert [a.task("train", i) for i in range(20)] == [b.task("train", i) for i in range(20)]
    assert [a.task("eval", i) for i in range(20)] == [b.task("eval", i) for i in range(20)]
    assert a.kb("train").docs == b.kb("train").docs
    assert make_env(kb_seed=1).kb("train").docs != a.kb("train").docs
    assert make_env(seed=4).task("train", 0) != a.task("train", 0)  # the run seed picks the questions
    assert make_env(seed=4).task("eval", 0) == a.task("eval", 0)  # but not the eval ones


@pytest.mark.parametrize("seed", range(5))
def test_names_are_unique_and_every_entity_has_every_relation(seed):
    kb = KnowledgeBase.generate(seed, 60, 20, 20, 8)
    names = [e.name for e in kb.entities]
    assert len(names) == 108 and len({n.lower() for n in names}) == 108
    assert len(set(words(kb))) == len(words(kb))  # no word is shared by two names
    assert len({d.id for d in kb.docs}) == 108 and all(d.id[0] == "d" and d.id[1:].isdigit() for d in kb.docs)
    kinds = {e.name: e.kind for e in kb.entities}
    assert sorted(kinds.values()).count("person") == 60
    for person in (n for n, k in kinds.items() if k == "person"):
        first, last = person.split()
        assert first.isalpha() and last.isalpha() and first[0].isupper()
    for e in kb.entities:
        for relation, (subject_kind, object_kind) in RELATIONS.items():
            if subject_kind == e.kind:
                assert kinds[kb.facts[e.name, relation]] == object_kind
    for country in (n for n, k in kinds.items() if k == "country"):  # a capital lies in its own country
        assert kb.facts[kb.facts[country, "capital"], "country"] == country


def test_documents_state_kind_and_facts():
    kb = KnowledgeBase.generate(0, 40, 12, 12, 5)
    org = next(e for e in kb.entities if e.kind == "organisation")
    doc = kb.by_title[org.name]
    founder, hq = kb.facts[org.name, "founder"], kb.facts[org.name, "headquarters"]
    assert doc.body == (f"{org.name} is an organisation. The founder of {org.name} is {founder}. "
                        f"The headquarters of {org.name} is {hq}.")
    assert org.name.split()[-1] in ORG_SUFFIXES


def test_eval_kb_is_disjoint_from_train_kb():
    for kb_seed in range(3):
        env = make_env(kb_seed=kb_seed)
        train, evals = env.kb("train"), env.kb("eval")
        assert not {e.name for e in train.entities} & {e.name for e in evals.entities}
        assert not set(words(train)) & set(words(evals))
        assert env.task("eval", 0).answer in {e.name for e in evals.entities}
        assert env.task("warmstart", 0).split == "train"


@pytest.mark.parametrize("split", ["train", "eval"])
def test_question_chains_match_the_kb(split):
    env = make_env(min_hops=1, max_hops=4)
    kb = env.kb(split)
    lengths = set()
    for i in range(200):
        task = env.task(split, i)
        assert task.split == split and task.uid.startswith(f"{split}-")
        assert 1 <= len(task.hops) <= 4
        lengths.add(len(task.hops))
        assert task.answer == task.hops[-1].answer
        entities = [subject_of(task.hops[0])] + [h.answer for h in task.hops]
        assert len(set(entities)) == len(entities)  # no entity visited twice
        relations = []
        for hop, subject in zip(task.hops, entities, strict=False):
            relation, named = hop.subtask.split(" of ", 1)
            assert named == subject
            relations.append(relation)
            assert f"The {relation} of {subject} is {hop.answer}." in kb.by_title[subject].body
            assert env.subtask_answer(task, hop.subtask) == hop.answer
            assert env.expert(task, hop.subtask, hop.answer) == 1.0
        nested = "".join(f"the {r} of " for r in reversed(relations))
        assert task.question == f"What is {nested}{entities[0]}?"
    assert lengths == {1, 2, 3, 4}


def test_question_example_shape():
    task = make_env(min_hops=3, max_hops=3).task("train", 5)
    assert len(task.hops) == 3 and task.question.startswith("What is the ") and task.question.count(" of ") == 3


@pytest.mark.parametrize("split", ["train", "eval"])
def test_searching_a_subtask_finds_its_subject(split):
    env = make_env(seed=7)
    hits = total = 0
    for i in range(200):
        task = env.task(split, i)
        for hop in task.hops:
            total += 1
            hits += f"[{env.doc_id(task, subject_of(hop))}] {subject_of(hop)}" in env.search(task, hop.subtask)
    assert hits / total >= 0.95


@pytest.mark.parametrize("query", ['"', '""', "AND", "OR NOT", "*", "-", "a -b", "NEAR(x y)", "^", "title:x",
                                   "founder:*", "'; DROP TABLE docs; --", "()", "Zörvex ünïcode", "x" * 5000,
                                   " ".join(f"w{i}" for i in range(500))])
def test_search_is_safe_for_any_query(query):
    env = make_env()
    task = env.task("train", 0)
    out = env.search(task, query)
    assert isinstance(out, str) and out
    assert fts_query(query).count('"') % 2 == 0


@pytest.mark.parametrize("query", ["", "   ", "!!!", "-", "*"])
def test_search_without_words_has_no_results(query):
    env = make_env()
    assert env.search(env.task("train", 0), query) == "no results"


def test_search_output_format_and_top_k():
    env = make_env(search_top_k=2)
    task = env.task("train", 0)
    out = env.search(task, task.hops[0].subtask)
    parts = out.split(" | ")
    assert len(parts) == 2 and all(p.startswith("[d") and "] " in p for p in parts)


def test_open():
    env = make_env(max_doc_chars=60)
    task = env.task("train", 0)
    subject = subject_of(task.hops[0])
    doc = env.doc_id(task, subject)
    assert doc is not None and env.doc_id(task, "Nobody Here") is None
    text = env.open(task, f" [{doc}] ")
    assert text.startswith(f"[{doc}] {subject}: {subject} is ") and len(text) == 60
    full = make_env(max_doc_chars=4000).open(task, doc)
    assert full == f"[{doc}] {subject}: {env.kb('train').by_title[subject].body}"
    assert f"The {task.hops[0].subtask} is {task.hops[0].answer}." in full
    assert env.open(task, "d999999") == "no document d999999"
    assert env.open(task, "") == "no document "


# --- judges ----------------------------------------------------------------------------------------


def test_subtask_answer_grammar():
    env = make_env()
    task = env.task("train", 0)
    hop = task.hops[0]
    relation, subject = hop.subtask.split(" of ", 1)
    for variant in (hop.subtask, f"  {hop.subtask.upper()}  ", f"the {hop.subtask}?", f"The {relation} of "
                    f"{subject.lower()}.", f"{relation}  of   {subject} ?"):
        assert env.subtask_answer(task, variant) == hop.answer, variant
    kinds = {e.name: e.kind for e in env.kb("train").entities}
    wrong_kind = next(r for r, (k, _) in RELATIONS.items() if k != kinds[subject])
    for bad in ("", "founder", f"{relation} of", f"ceo of {subject}", f"{relation} of Nobody Atall",
                f"{wrong_kind} of {subject}", f"{relation} of the {subject}", f"{relation} {subject}",
                f"birthplace of the founder of {subject}"):
        assert env.subtask_answer(task, bad) is None, bad


def test_expert():
    env = make_env()
    task = env.task("train", 1)
    hop = task.hops[0]
    assert env.expert(task, hop.subtask, hop.answer) == 1.0
    assert env.expert(task, hop.subtask, f"  {hop.answer.upper()}. ") == 1.0
    assert env.expert(task, hop.subtask, "Somebody Else") == 0.0
    assert env.expert(task, hop.subtask, None) == 0.0
    assert env.expert(task, "ceo of Nowhere", hop.answer) is None


def test_correct_normalises():
    env = make_env()
    task = ResearchTask("q?", "Mira Tal", (), "train", "train-0")
    for answer in ("Mira Tal", "mira tal", "  MIRA   TAL.", "Mira\tTal!?", "mira tal ."):
        assert env.correct(task, answer), answer
    for answer in (None, "", "Mira", "Mira Tal Jr", "Mira-Tal"):
        assert not env.correct(task, answer), answer


def test_episode():
    env = make_env()
    task = env.task("train", 2)
    state = env.initial_state(task)
    assert state == ResearchState(task) and env.observe(state) == f"Question: {task.question}"
    assert len(env.rules()) <= 200 and "search" in env.rules() and "open" in env.rules()
    assert env.oracle(state) == task.answer and env.score(state) == 0.0
    t = env.step(state, f" {task.answer.lower()} ")
    assert (t.reward, t.done, t.success, t.format_ok, t.info) == (1.0, True, True, True, {"correct": 1.0})
    assert env.score(t.state) == 1.0
    t = env.step(state, "wrong")
    assert (t.reward, t.done, t.success, t.format_ok) == (0.0, True, False, True) and env.score(t.state) == 0.0
    t = env.step(state, None)
    assert (t.reward, t.done, t.success, t.format_ok) == (0.0, True, False, False) and t.state.answer is None


@pytest.mark.parametrize("kw,message", [
    ({"min_hops": 0}, "env.min_hops must be at least 1"),
    ({"min_hops": 3, "max_hops": 2}, "env.max_hops must lie in"),
    ({"people": 1}, "env.people must be at least 2"),
    ({"countries": 0}, "env.countries must be at least 2"),
    ({"search_top_k": 0}, "env.search_top_k must be at least 1"),
    ({"web": WebSearchConfig(timeout_s=0)}, "env.web.timeout_s must be positive"),
])
def test_config_errors_are_one_line(kw, message):
    with pytest.raises(ConfigError, match=message) as err:
        make_env(**kw)
    assert "\n" not in str(err.value)


# --- online sources --------------------------------------------------------------------------------


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


ROWS = [{"question": f"Who wrote book {i}?", "answer": f"Author {i}", "id": i} for i in range(10)]


def test_local_jsonl_skips_malformed_rows(tmp_path, caplog):
    rows = [*ROWS[:3], {"question": "", "answer": "x"}, {"question": "q", "answer": None}, {"id": 5}, ROWS[0]]
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="marl_cli.envs.sources"):
        pairs = load_questions(ResearchSourceConfig(source=path), "env.eval")
    assert pairs == [(r["question"], r["answer"]) for r in ROWS[:3]]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "skipped 3 of 7 rows" in warnings[0] and "rows 3, 4, 5" in warnings[0]


def test_local_csv_with_renamed_fields_and_limit(tmp_path):
    (tmp_path / "t.csv").write_text("Q,A,other\nWhat is x?,7,a\nWhat is y?,,b\nWhat is z?,zed,c\nWhat is w?,w,d\n")
    cfg = ResearchSourceConfig(source="whatever", path=str(tmp_path / "t.csv"), question_field="Q",
                               answer_field="A", limit=2)
    assert load_questions(cfg, "env.train") == [("What is x?", "7"), ("What is z?", "zed")]


def test_bad_field_name_lists_the_columns(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", ROWS)
    with pytest.raises(ConfigError) as err:
        load_questions(ResearchSourceConfig(source=path, answer_field="Final answer"), "env.eval")
    assert str(err.value) == "env.eval.answer_field='Final answer' is not a column; columns: question, answer, id"
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"text": "q", "label": "a"}])
    with pytest.raises(ConfigError, match="columns: text, label"):
        load_questions(ResearchSourceConfig(source=bad), "env.eval")
    with pytest.raises(ConfigError, match="no such file"):
        load_questions(ResearchSourceConfig(source=str(tmp_path / "nope.parquet")), "env.eval")
    with pytest.raises(ConfigError, match="limit must be non-negative"):
        load_questions(ResearchSourceConfig(source=path, limit=-1), "env.eval")


def test_preset_fields_apply_to_a_local_copy(tmp_path):
    gaia = write_jsonl(tmp_path / "gaia.jsonl", [{"task_id": "a", "Question": "Q1?", "Final answer": "17"}])
    assert load_questions(ResearchSourceConfig(source="gaia", path=gaia), "env.eval") == [("Q1?", "17")]

    def encode(text: str, key: str) -> str:
        pad = key.encode()
        return base64.b64encode(bytes(b ^ pad[i % len(pad)] for i, b in enumerate(text.encode()))).decode()

    rows = [{"id": 1, "prompt": encode("Which city? é", "k3y"), "answer": encode("Paris", "k3y"), "canary": "k3y"},
            {"id": 2, "prompt": "not base64!", "answer": encode("x", "k"), "canary": "k"}]
    xbench = write_jsonl(tmp_path / "xbench.jsonl", rows)
    assert load_questions(ResearchSourceConfig(source="xbench", path=xbench), "env.eval") == [("Which city? é",
                                                                                                "Paris")]


def test_online_tasks_have_no_kb(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", ROWS)
    env = make_env(eval=ResearchSourceConfig(source=path))
    task = env.task("eval", 12)
    assert task == ResearchTask("Who wrote book 2?", "Author 2", (), "eval", "eval-2")
    assert env.subtask_answer(task, "founder of Anything") is None and env.doc_id(task, "x") is None
    assert env.expert(task, "founder of Anything", "x") is None
    assert env.search(task, "book") == "search failed: no search endpoint configured (set env.web.url)"
    assert env.task("train", 0).hops  # the train split stays embedded
    both = make_env(seed=1, train=ResearchSourceConfig(source=path), eval=ResearchSourceConfig(source=path))
    assert both.questions["eval"] is both.questions["train"]
    assert {both.task("train", i).uid for i in range(10)} == {f"train-{i}" for i in range(10)}


# --- web backend -----------------------------------------------------------------------------------


SEEN: list[dict[str, str]] = []  # the requests the server got: path and lower-cased headers


class _Handler(BaseHTTPRequestHandler):

    def log_message(self, *args):
        pass

    def _send(self, code: int, body: str, content_type: str) -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        SEEN.append({"path": self.path, **{k.lower(): v for k, v in self.headers.items()}})
        if self.path.startswith("/list"):
            results = [{"title": "<b>One</b>", "url": "http://a/1", "snippet": "first &amp; best"},
                       {"title": "Two", "link": "http://a/2", "description": "second"},
                       {"title": "no url"}, "junk", {"title": "Three", "url": "http://a/3"}]
            self._send(200, json.dumps(results), "application/json")
        elif self.path.startswith("/brave"):
            self._send(200, json.dumps({"web": {"results": [{"title": "B", "url": "http://b/", "description": "d"}]}}),
                       "application/json")
        elif self.path.startswith("/items"):
            self._send(200, json.dumps({"items": []}), "application/json")
        elif self.path.startswith("/page"):
            self._send(200, "<html><head><title>T</title><style>p{x:1}</style></head><body><script>var a=1;"
                       "</script><h1>Head</h1><p>Hello&nbsp;<b>world</b>  and\n more.</p><div>Bye</div></body></html>",
                       "text/html; charset=utf-8")
        elif self.path.startswith("/text"):
            self._send(200, "plain " * 100, "text/plain")
        elif self.path.startswith("/notjson"):
            self._send(200, "<html>oops</html>", "text/html")
        elif self.path.startswith("/shape"):
            self._send(200, json.dumps({"data": [], "web": ["not", "an", "object"]}), "application/json")
        else:
            self._send(500, "boom", "text/plain")


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def web(url: str, **kw) -> WebSearch:
    return WebSearch(WebSearchConfig(url=url, timeout_s=5, **kw))


def test_web_search_parses_a_list_and_sends_a_bearer_key(server):
    SEEN.clear()
    ws = web(f"{server}/list", api_key="secret")
    assert ws.search("who & what", 3) == [("http://a/1", "One", "first & best"), ("http://a/2", "Two", "second"),
                                          ("http://a/3", "Three", "")]
    assert SEEN[-1]["authorization"] == "Bearer secret"
    assert SEEN[-1]["path"] == "/list?q=who+%26+what&count=3"
    assert ws.search("x", 1) == [("http://a/1", "One", "first & best")] and ws.failures == 0


def test_web_search_parses_nested_results_with_a_raw_key_header(server):
    SEEN.clear()
    ws = web(f"{server}/brave?country=us", api_key="tok", header="X-Subscription-Token")
    assert ws.search("q", 2) == [("http://b/", "B", "d")]
    assert SEEN[-1]["x-subscription-token"] == "tok" and "authorization" not in SEEN[-1]
    assert SEEN[-1]["path"] == "/brave?country=us&q=q&count=2"
    assert web(f"{server}/items").search("q", 2) == []
    assert "api" not in web(f"{server}/list").search("q", 1)[0][0]  # no key configured: no header needed


def test_web_errors_are_observations(server):
    ws = web(f"{server}/fail")
    assert ws.search("q", 3) == "search failed: HTTP 500 Internal Server Error"
    assert web(f"{server}/notjson").search("q", 3).startswith("search failed: JSONDecodeError")
    assert web(f"{server}/shape").search("q", 3) == "search failed: ValueError: no list of results in the JSON answer"
    assert web("").search("q", 3).startswith("search failed: no search endpoint")
    assert web("http://127.0.0.1:1/").search("q", 3).startswith("search failed: ")  # connection refused
    assert ws.open(f"{server}/fail") == "open failed: HTTP 500 Internal Server Error"
    assert ws.open("file:///etc/passwd").startswith("open failed: not an http(s) url")
    assert ws.open("").startswith("open failed: ")
    assert ws.failures == 4


def test_web_open_reduces_html_to_text(server):
    SEEN.clear()
    ws = web(f"{server}/list", api_key="secret", max_page_chars=50)
    assert ws.open(f"{server}/page") == "Head\nHello world and more.\nBye"
    assert "authorization" not in SEEN[-1]  # the search key never goes to pages
    assert ws.open(f"{server}/text") == ("plain " * 100)[:50]
    assert html_to_text("<p>a<br>b</p><noscript>x</noscript>") == "a\nb"


def test_env_renders_web_results(server, tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", ROWS)
    env = make_env(eval=ResearchSourceConfig(source=path), web=WebSearchConfig(url=f"{server}/list", top_k=2))
    task = env.task("eval", 0)
    assert env.search(task, "x") == "[http://a/1] One: first & best | [http://a/2] Two: second"
    assert env.open(task, f"{server}/page").startswith("Head")


# --- config ----------------------------------------------------------------------------------------


def test_env_yaml_composes_and_builds():
    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["env=research", "env.max_hops=4"])
    OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert cfg.env.name == "research" and cfg.env.actions_per_episode == 1 and cfg.env.eval_size == 100
    env = build_env(cfg.env, seed=0)
    assert isinstance(env, ResearchEnv)
    task = env.task("train", 0)
    assert 2 <= len(task.hops) <= 4 and env.correct(task, env.oracle(env.initial_state(task)))
    rng = random.Random(0)
    assert env.kb("eval").question(rng, 2, 2).hops


def test_eval_kb_train_asks_eval_questions_about_the_training_kb():
    shared = ResearchEnv(OmegaConf.structured(ResearchConfig(eval_kb="train")))
    task = shared.task("eval", 0)
    assert task.split == "train" and task.question != shared.task("train", 0).question
    assert shared.subtask_answer(task, task.hops[0].subtask) == task.hops[0].answer
    assert shared.doc_id(task, task.hops[0].subtask.split(" of ", 1)[1]) is not None
    with pytest.raises(ValidationError, match="expected one of \\[separate, train\\]"):
        OmegaConf.structured(ResearchConfig(eval_kb="both"))
