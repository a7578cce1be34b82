"""opsgen: generated operations-assistant tool-calling conversations.

Shared by make_corpus.py (training text) and the held-out eval sets, so both
come from one distribution; entity names (services, flags, namespaces, ...)
come from disjoint pools for the 'train' and 'heldout' splits, and ids and
numbers are drawn fresh.

Prompts are rendered exactly as `strata taskeval` renders a case with
strata's ChatML template (apps/eval/taskeval.c build_prompt,
src/mkmodel/mkmodel.c k_chat_template): tool schemas in the system message
after "Available tools (JSON schemas), one per line:", tool results as user
turns wrapped in <tool_response>, earlier calls appended to assistant content.
"""
import json
import random

# ---------------------------------------------------------------- pools ----

_WORDS = ("auth billing search checkout payments inventory catalog orders gateway ledger notify mailer "
          "profile session cart pricing shipping invoice report metrics audit export import media upload "
          "thumbnail geo routing booking quote review rating loyalty coupon fraud risk identity token "
          "chat feed timeline graph index crawler scheduler cron batch stream ingest etl warehouse "
          "analytics tracking ads banner promo survey support helpdesk wiki docs portal admin console "
          "billingv2 partner vendor supplier fleet driver dispatch map tiles weather forecast sensor "
          "telemetry device firmware update release deploy build artifact registry cache proxy edge "
          "dns cert vault secret config flags consent privacy backup archive cold hot sync relay").split()
_SUFFIX = "api worker service web backend frontend consumer processor daemon sync svc".split()
_NS = ("prod-east prod-west prod-eu staging-a staging-b payments core platform data ml edge web mobile "
       "internal public batch infra observability security growth search-team ops checkout-ns").split()
_FLAG_A = ("new dark beta fast smart instant express unified legacy modern compact async bulk live "
           "one-click guest multi auto safe quick").split()
_FLAG_B = ("checkout mode search pricing onboarding login signup cart export dashboard invoices "
           "recommendations payments uploads reports navigation profile billing sharing alerts").split()
_DB = ("orders users accounts events products payments sessions metrics inventory ledger audit "
       "customers invoices tickets shipments catalog reviews analytics billing warehouse").split()
_TEAM = ("platform payments search data infra mobile web security identity growth storage network "
         "database sre checkout frontend backend ml release observability").split()
_SECRET = ("db-password api-key stripe-token smtp-password oauth-client-secret jwt-signing-key "
           "s3-access-key redis-password github-token slack-webhook tls-private-key kafka-credentials "
           "sentry-dsn datadog-api-key twilio-token sendgrid-key pagerduty-key vault-token ldap-bind "
           "grafana-admin").split()
ENVS = ["production", "staging", "dev"]
LEVELS = ["error", "warn", "info", "debug"]

_PROBLEMS = ["disk almost full on the database hosts", "checkout latency above two seconds",
             "certificate expires tomorrow", "error rate spiking after the last deploy",
             "queue backlog keeps growing", "memory leak in the worker pods", "login failures for EU users",
             "payment callbacks timing out", "search results are empty", "cron jobs did not run overnight",
             "high CPU on the cache nodes", "DNS lookups failing intermittently", "webhooks returning 500",
             "replication lag over ten minutes", "uploads stuck in pending", "emails not being delivered",
             "dashboard shows stale data", "pods restarting in a loop", "API gateway returns 502",
             "backup job failed twice", "slow queries on the reports page", "traffic drop in the mobile app",
             "rate limiter blocking partners", "stale cache after the price update"]
_RESOLUTIONS = ["fixed by restarting the worker", "rolled back the bad release", "config corrected",
                "duplicate of an older ticket", "disk cleaned up and alert tuned", "certificate renewed",
                "scaled up the consumers", "vendor outage, resolved upstream", "index rebuilt",
                "not reproducible", "patched the memory leak", "quota raised by the provider"]


def _split(pool, part):
    """Deterministic split: every 4th item is held out."""
    return [w for i, w in enumerate(pool) if (i % 4 == 3) == (part == "heldout")]


def held_words():
    """Every held-out pool word (split at '-') and every held-out phrase: never a training name."""
    held = set()
    for pool in (_WORDS, _NS, _FLAG_A, _FLAG_B, _DB, _TEAM, _SECRET):
        for w in _split(pool, "heldout"):
            held.update(w.split("-"))
    for ph in _split(_PROBLEMS, "heldout") + _split(_RESOLUTIONS, "heldout"):
        held.add(ph)
    return held


def _dict_words():
    """Open vocabulary for training names: Debian wamerican words (2-12 lower-case letters), minus
    every held-out pool word, so names cannot be memorised as a closed set and copying is learned."""
    try:
        with open("/usr/share/dict/american-english", encoding="utf-8") as f:
            ws = [w.strip() for w in f]
    except OSError:
        return []
    held = held_words()
    return sorted({w for w in ws if w.isascii() and w.isalpha() and w.islower() and 2 <= len(w) <= 12
                   and w not in held})


# function words for generated phrases (held-out titles and resolutions have them: "duplicate of an
# older ticket", "emails not being delivered"); 2-letter words are not in the open word list
_STOP = ("of an a the on in to by for at is be not no and or with from after before over under into as "
         "it its this that was were are being been has had all some any more less than then now up out "
         "off down per via new old").split()


class CopyVocab:
    """Training names and phrases whose BPE pieces cover the whole vocabulary (copy practice).

    The model copies argument values from the request into the tool call, where the first word
    loses its leading space and so is spelled with other pieces (' risk' -> 'Ġr' 'isk' in the
    request, 'ris' 'k' in the JSON). A word drawn uniformly from a dictionary puts frequent pieces
    in copy position again and again and rare ones almost never, and the model then writes a
    frequent piece for a rare one. So draws here are balanced by piece: count every piece that
    a drawn name puts into copy position (its bare and its space-prefixed tokenisation), and
      - 'piece' draws (60%): take the least-used of 16 random pieces, then a random word that
        contains it (so every piece found in some word is drawn about equally often; for words
        inside a phrase, which keep their leading space when copied, the space-prefixed pieces);
      - 'string' draws (25%): 1-3 least-used bare letter pieces of the vocabulary joined, e.g.
        'ris' + 'outing' (pieces no dictionary word produces get practice too);
      - 'plain' draws (15%): a uniform dictionary word (natural names).
    Phrases mix these with function words, capitalised words, acronyms and commas, or are
    word spans of the training prose (spans). Held-out words and phrases are never produced.
    Deterministic given the caller's random.Random."""

    def __init__(self, words, encode, token_texts, spans=()):
        self.words = words
        self.encode = encode
        self.held = held_words()
        self.cnt = {}
        idx, idx_sp = {}, {}
        for w in words:
            sp = encode(" " + w)
            for t in set(encode(w)) | set(sp):
                idx.setdefault(t, []).append(w)
            for t in set(sp):
                idx_sp.setdefault(t, []).append(w)
        self.idx, self.idx_sp = idx, idx_sp
        self.toks, self.toks_sp = sorted(idx), sorted(idx_sp)
        # bare lower-case letter pieces (GPT-2 byte alphabet: a leading space is 'Ġ')
        self.pieces = [t for t, s in enumerate(token_texts)
                       if s.isascii() and s.isalpha() and s.islower() and not s.startswith("Ġ")]
        self.piece_text = {t: token_texts[t] for t in self.pieces}
        self.spans = list(spans)
        self.stop = [w for w in _STOP if w not in self.held]

    def use(self, text):
        for t in self.encode(text) + self.encode(" " + text):
            self.cnt[t] = self.cnt.get(t, 0) + 1

    def _least(self, r, cands, k=16):
        best = None
        for _ in range(k):
            t = r.choice(cands)
            if best is None or self.cnt.get(t, 0) < self.cnt.get(best, 0):
                best = t
        return best

    def word(self, r, inner=False):
        """inner: a word inside a phrase, copied with its leading space: balance its spaced pieces."""
        x = r.random()
        while True:
            if x < 0.6 and inner:
                w = r.choice(self.idx_sp[self._least(r, self.toks_sp)])
            elif x < 0.6:
                w = r.choice(self.idx[self._least(r, self.toks)])
            elif x < 0.85:
                w = "".join(self.piece_text[self._least(r, self.pieces)] for _ in range(r.randint(1, 3)))
                if not 3 <= len(w) <= 14:
                    continue
            else:
                w = r.choice(self.words)
            if w not in self.held:
                self.use(w)
                return w

    def phrase(self, r):
        if self.spans and r.random() < 0.3:
            while True:
                p = r.choice(self.spans)
                ws = p.split()
                n = r.randint(2, 7)
                if len(ws) < n:
                    continue
                i = r.randrange(len(ws) - n + 1)
                ws = [w for w in ws[i:i + n]]
                ws[-1] = ws[-1].rstrip(",")
                if not all(_SPAN_WORD.match(w) for w in ws):
                    continue
                ph = " ".join(ws)
                if r.random() < 0.5:
                    ph = ph.lower()
                if ph in self.held or any(w.strip(",").lower() in self.held for w in ws):
                    continue
                self.use(ph)
                return ph
        ws = []
        for i in range(r.randint(2, 6)):
            x = r.random()
            if i > 0 and x < 0.3:
                w = r.choice(self.stop)
                self.use(w)
            elif x < 0.36:
                w = "".join(r.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(r.randint(2, 4)))
                self.use(w)
            elif x < 0.42:
                w = self.word(r, i > 0).capitalize()
            else:
                w = self.word(r, i > 0)
            ws.append(w)
        ph = ws[0]
        for w in ws[1:]:
            ph += ("," if r.random() < 0.08 else "") + " " + w
        return ph


_SPAN_WORD = __import__("re").compile(r"^[A-Za-z][a-z]*(-[a-z]+)?,?$")


class Pools:
    def __init__(self, part):
        self.part = part
        self.open = _dict_words() if part == "train" else []
        self.words = _split(_WORDS, part)
        self.ns = _split(_NS, part)
        self.flag_a, self.flag_b = _split(_FLAG_A, part), _split(_FLAG_B, part)
        self.db = _split(_DB, part)
        self.team = _split(_TEAM, part)
        self.secret = _split(_SECRET, part)
        self.problems = _split(_PROBLEMS, part)
        self.resolutions = _split(_RESOLUTIONS, part)


# ---------------------------------------------------------------- tools ----

def _fn(name, desc, props, required):
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": props, "required": required}}}


S = {"type": "string"}
I = {"type": "integer"}
B = {"type": "boolean"}
ENV = {"type": "string", "enum": ENVS}

TOOLS = {
    "restart_service": _fn("restart_service", "Restart a service", {"service": S, "environment": ENV, "force": B},
                           ["service", "environment"]),
    "scale_deployment": _fn("scale_deployment", "Set the replica count of a deployment",
                            {"deployment": S, "replicas": I, "namespace": S}, ["deployment", "replicas"]),
    "query_logs": _fn("query_logs", "Search recent logs of a service",
                      {"service": S, "level": {"type": "string", "enum": LEVELS}, "since_minutes": I, "limit": I},
                      ["service", "level", "since_minutes"]),
    "set_feature_flag": _fn("set_feature_flag", "Turn a feature flag on or off",
                            {"flag": S, "enabled": B, "environment": ENV}, ["flag", "enabled", "environment"]),
    "get_service_status": _fn("get_service_status", "Health and replica status of a service",
                              {"service": S, "environment": ENV}, ["service"]),
    "rollback_deployment": _fn("rollback_deployment", "Roll a deployment back to a revision",
                               {"deployment": S, "revision": I, "namespace": S}, ["deployment", "revision"]),
    "create_incident": _fn("create_incident", "Open an incident",
                           {"title": S, "severity": I, "service": S}, ["title", "severity", "service"]),
    "acknowledge_alert": _fn("acknowledge_alert", "Acknowledge an alert", {"alert_id": S, "note": S}, ["alert_id"]),
    "silence_alert": _fn("silence_alert", "Silence an alert for a while",
                         {"alert_id": S, "duration_minutes": I}, ["alert_id", "duration_minutes"]),
    "drain_node": _fn("drain_node", "Drain a cluster node", {"node_id": S, "force": B}, ["node_id"]),
    "run_backup": _fn("run_backup", "Start a database backup", {"database": S, "incremental": B},
                      ["database", "incremental"]),
    "rotate_secret": _fn("rotate_secret", "Rotate a secret", {"secret_name": S, "environment": ENV},
                         ["secret_name", "environment"]),
    "page_oncall": _fn("page_oncall", "Page the on-call engineer of a team",
                       {"team": S, "message": S, "urgent": B}, ["team", "message", "urgent"]),
    "get_ticket": _fn("get_ticket", "Look up a ticket", {"ticket_id": S}, ["ticket_id"]),
    "close_ticket": _fn("close_ticket", "Close a ticket", {"ticket_id": S, "resolution": S},
                        ["ticket_id", "resolution"]),
}
TOOL_NAMES = list(TOOLS)

SYSTEMS = [None, None, "You are an operations assistant.",
           "You are an operations assistant for the platform team. Use the tools to act.",
           "You help on-call engineers run infrastructure tasks.",
           "You are strata-ops, a careful assistant for production operations."]


# ------------------------------------------------------------- requests ----

class Gen:
    def __init__(self, part, seed, vocab=None):
        """vocab: a CopyVocab for the training split (token-balanced open names); without one the
        training split draws open names uniformly from the word list. The held-out split never
        draws open names, so its random stream does not depend on vocab."""
        self.p = Pools(part)
        self.r = random.Random(seed)
        self.vocab = vocab if part == "train" else None

    def c(self, xs):
        return self.r.choice(xs)

    # open-vocabulary draws (training only: the held-out RNG stream is unchanged)
    def op(self):
        return bool(self.p.open) and self.r.random() < (0.85 if self.vocab else 0.7)

    def ow(self):
        if self.vocab:
            return self.vocab.word(self.r)
        return self.c(self.p.open)

    def phrase(self):
        if self.vocab:
            return self.vocab.phrase(self.r)
        return " ".join(self.ow() for _ in range(self.r.randint(2, 6)))

    # entities
    def service(self):
        return (self.ow() if self.op() else self.c(self.p.words)) + "-" + self.c(_SUFFIX)

    def flag(self):
        if self.op():
            return self.ow() + "-" + self.ow()
        return self.c(self.p.flag_a) + "-" + self.c(self.p.flag_b)

    def ns(self):
        if self.op():
            return self.ow() + self.c(["", "-prod", "-a", "-team", "-" + self.ow()])
        return self.c(self.p.ns)

    def db(self):
        return self.ow() if self.op() else self.c(self.p.db)

    def team(self):
        return self.ow() if self.op() else self.c(self.p.team)

    def secret(self):
        if self.op():
            return self.ow() + "-" + self.c(["key", "token", "password", "secret", "credentials"])
        return self.c(self.p.secret)

    def problem(self):
        return self.phrase() if self.op() else self.c(self.p.problems)

    def resolution(self):
        return self.phrase() if self.op() else self.c(self.p.resolutions)

    def alert_id(self):
        return "ALR-%d" % self.r.randint(1000, 99999)

    def node_id(self):
        return "node-%s" % "".join(self.c("0123456789abcdef") for _ in range(self.r.choice([4, 5, 6])))

    def ticket_id(self):
        return "%s-%d" % (self.c(["OPS", "INC", "SUP", "REQ"]), self.r.randint(100, 9999))

    def env(self):
        return self.c(ENVS)

    def envword(self, e):
        return self.c({"production": ["production", "prod", "production"], "staging": ["staging", "staging"],
                       "dev": ["dev", "the dev environment", "development"]}[e])

    # one request: (user text, call name, args, ids)
    def request(self, name):
        r, c = self.r, self.c
        if name == "restart_service":
            s, e = self.service(), self.env()
            a = {"service": s, "environment": e}
            force = c([None, None, True, False])
            t = c(["Restart {s} in {e}.", "Please restart the {s} service on {e}.", "Can you bounce {s} in {e}?",
                   "{s} is stuck in {e}, restart it.", "Restart the {s} service ({e})."])
            t = t.format(s=s, e=self.envword(e))
            if force is True:
                t += c([" Force it.", " Use force if needed.", " Force the restart."])
            elif force is False:
                t += c([" Do not force it.", " No force, please.", " A graceful restart, not forced."])
            if force is not None:
                a["force"] = force
            return t, a, []
        if name == "scale_deployment":
            d, n = self.service(), r.choice([r.randint(0, 12), r.randint(1, 60)])
            a = {"deployment": d, "replicas": n}
            ns = c([None, self.ns()])
            t = c(["Scale {d} to {n} replicas.", "Set {d} to {n} replicas please.", "We need {n} replicas of {d}.",
                   "Scale the {d} deployment to {n}.", "Change the replica count of {d} to {n}."]).format(d=d, n=n)
            if ns:
                a["namespace"] = ns
                t = t[:-1] + c([" in namespace {ns}.", " in the {ns} namespace.", " (namespace {ns})."]).format(ns=ns)
            return t, a, []
        if name == "query_logs":
            s, lv, m = self.service(), c(LEVELS), c([5, 10, 15, 30, 45, 60, 90, 120, 180, 240, r.randint(2, 600)])
            a = {"service": s, "level": lv, "since_minutes": m}
            lim = c([None, None, 20, 50, 100, 200, r.randint(5, 500)])
            t = c(["Show me the {lv} logs of {s} from the last {m} minutes.",
                   "Query {lv} logs for {s}, past {m} minutes.",
                   "What {lv} messages did {s} log in the last {m} minutes?",
                   "Pull {s} logs at level {lv} for the last {m} minutes."]).format(s=s, lv=lv, m=m)
            if lim is not None:
                a["limit"] = lim
                t = t[:-1] + c([", at most {l} lines.", ", limit {l}.", " (max {l} entries)."]).format(l=lim)
            return t, a, []
        if name == "set_feature_flag":
            f, on, e = self.flag(), c([True, False]), self.env()
            a = {"flag": f, "enabled": on, "environment": e}
            if on:
                t = c(["Enable the {f} flag in {e}.", "Turn on {f} for {e}.", "Switch {f} on in {e}.",
                       "Please enable feature flag {f} on {e}."])
            else:
                t = c(["Disable the {f} flag in {e}.", "Turn off {f} for {e}.", "Switch {f} off in {e}.",
                       "Please disable feature flag {f} on {e}."])
            return t.format(f=f, e=self.envword(e)), a, []
        if name == "get_service_status":
            s = self.service()
            a = {"service": s}
            e = c([None, self.env()])
            t = c(["What is the status of {s}?", "Is {s} healthy?", "Check the status of {s}.",
                   "How is {s} doing?"]).format(s=s)
            if e:
                a["environment"] = e
                t = t[:-1] + " in " + self.envword(e) + t[-1]
            return t, a, []
        if name == "rollback_deployment":
            d, rev = self.service(), r.randint(1, 99)
            a = {"deployment": d, "revision": rev}
            ns = c([None, self.ns()])
            t = c(["Roll back {d} to revision {v}.", "Rollback {d} to rev {v}.",
                   "The last release of {d} is bad, go back to revision {v}.",
                   "Revert {d} to revision {v}."]).format(d=d, v=rev)
            if ns:
                a["namespace"] = ns
                t = t[:-1] + c([" in namespace {ns}.", " in the {ns} namespace."]).format(ns=ns)
            return t, a, []
        if name == "create_incident":
            ti, sv, s = self.problem(), r.randint(1, 4), self.service()
            a = {"title": ti, "severity": sv, "service": s}
            t = c(["Open a severity {sv} incident for {s} titled \"{ti}\".",
                   "Create an incident on {s}: \"{ti}\", severity {sv}.",
                   "File a sev {sv} incident for {s} with the title \"{ti}\"."]).format(ti=ti, sv=sv, s=s)
            return t, a, []
        if name == "acknowledge_alert":
            i = self.alert_id()
            a = {"alert_id": i}
            t = c(["Acknowledge alert {i}.", "Ack {i} please.", "I am on {i}, acknowledge it.",
                   "Please acknowledge the alert {i}."]).format(i=i)
            if r.random() < 0.35:
                note = c(["looking into it", "known issue", "investigating now", "deploy in progress",
                          "handled by " + self.team()])
                a["note"] = note
                t = t[:-1] + " with the note \"%s\"." % note
            return t, a, ["alert_id"]
        if name == "silence_alert":
            i, m = self.alert_id(), c([15, 30, 45, 60, 90, 120, 240, 480, r.randint(5, 900)])
            t = c(["Silence {i} for {m} minutes.", "Mute alert {i} for {m} minutes.",
                   "Please silence the alert {i} for the next {m} minutes."]).format(i=i, m=m)
            return t, {"alert_id": i, "duration_minutes": m}, ["alert_id"]
        if name == "drain_node":
            n = self.node_id()
            a = {"node_id": n}
            t = c(["Drain {n}.", "Please drain node {n}.", "Take {n} out of rotation by draining it."]).format(n=n)
            force = c([None, True, False])
            if force is True:
                t += c([" Force it.", " Use force."])
            elif force is False:
                t += c([" Do not force it.", " Without force."])
            if force is not None:
                a["force"] = force
            return t, a, ["node_id"]
        if name == "run_backup":
            db, inc = self.db() + c(["", "-db", "_main", "-primary"]), c([True, False])
            if inc:
                t = c(["Run an incremental backup of {d}.", "Start an incremental backup for the {d} database.",
                       "Back up {d}, incremental is fine."])
            else:
                t = c(["Run a full backup of {d}.", "Start a full backup for the {d} database.",
                       "Back up {d}, full, not incremental."])
            return t.format(d=db), {"database": db, "incremental": inc}, []
        if name == "rotate_secret":
            s, e = self.secret(), self.env()
            t = c(["Rotate the {s} secret in {e}.", "Please rotate {s} on {e}.",
                   "The {s} leaked, rotate it in {e}."]).format(s=s, e=self.envword(e))
            return t, {"secret_name": s, "environment": e}, []
        if name == "page_oncall":
            tm, msg, u = self.team(), self.problem(), c([True, False])
            t = c(["Page the {tm} on-call: \"{m}\".", "Let the {tm} team's on-call know: \"{m}\".",
                   "Page {tm} on-call with the message \"{m}\"."]).format(tm=tm, m=msg)
            t += c([" It is urgent.", " Urgent!", " This is urgent."]) if u else c([" Not urgent.", " Low urgency.",
                                                                                    " It can wait, not urgent."])
            return t, {"team": tm, "message": msg, "urgent": u}, []
        if name == "get_ticket":
            i = self.ticket_id()
            t = c(["Look up ticket {i}.", "What is ticket {i} about?", "Show me {i}.",
                   "Fetch the details of ticket {i}."]).format(i=i)
            return t, {"ticket_id": i}, ["ticket_id"]
        if name == "close_ticket":
            i, res = self.ticket_id(), self.resolution()
            t = c(["Close {i} with resolution \"{r}\".", "Close ticket {i}: \"{r}\".",
                   "Please close {i}, resolution: \"{r}\"."]).format(i=i, r=res)
            return t, {"ticket_id": i, "resolution": res}, ["ticket_id"]
        raise KeyError(name)

    # tool result and the final answer that reports it (answer contains `key`)
    def result(self, name, a):
        r, c = self.r, self.c
        if name == "get_service_status":
            st = c(["healthy", "degraded", "down", "healthy", "starting"])
            ready = r.randint(0, 12)
            res = {"service": a["service"], "status": st, "replicas_ready": ready}
            ans = c(["{s} is {st} with {n} replicas ready.", "Status of {s}: {st}, {n} replicas ready."]).format(
                s=a["service"], st=st, n=ready)
            return res, ans, st
        if name == "query_logs":
            n = r.randint(0, 40)
            top = c(["connection refused", "timeout after 30s", "out of memory", "null pointer", "disk full",
                     "TLS handshake failed", "rate limit exceeded", "deadlock detected"])
            res = {"matches": n, "top_message": top}
            ans = "Found %d %s entries in %s; the most common is \"%s\"." % (n, a["level"], a["service"], top)
            return res, ans, top
        if name == "get_ticket":
            st = c(["open", "in progress", "blocked", "resolved"])
            ti = self.problem()
            res = {"ticket_id": a["ticket_id"], "title": ti, "status": st}
            ans = "Ticket %s is %s: \"%s\"." % (a["ticket_id"], st, ti)
            return res, ans, st
        if name == "create_incident":
            iid = "INC-%d" % r.randint(1000, 99999)
            res = {"incident_id": iid, "status": "open"}
            return res, "Opened incident %s (severity %d) for %s." % (iid, a["severity"], a["service"]), iid
        if name == "run_backup":
            bid = "bk-%d" % r.randint(10000, 999999)
            res = {"backup_id": bid, "status": "started"}
            return res, "The %s backup of %s started as %s." % (
                "incremental" if a["incremental"] else "full", a["database"], bid), bid
        ok = r.random() < 0.85
        res = {"ok": ok} if ok else {"ok": False, "error": c(["permission denied", "not found", "timeout"])}
        if ok:
            ans = {
                "restart_service": "Restarted %s in %s." % (a.get("service"), a.get("environment")),
                "scale_deployment": "Scaled %s to %s replicas." % (a.get("deployment"), a.get("replicas")),
                "set_feature_flag": "The %s flag is now %s in %s." % (
                    a.get("flag"), "on" if a.get("enabled") else "off", a.get("environment")),
                "rollback_deployment": "Rolled %s back to revision %s." % (a.get("deployment"), a.get("revision")),
                "acknowledge_alert": "Acknowledged %s." % a.get("alert_id"),
                "silence_alert": "Silenced %s for %s minutes." % (a.get("alert_id"), a.get("duration_minutes")),
                "drain_node": "Drained %s." % a.get("node_id"),
                "rotate_secret": "Rotated %s in %s." % (a.get("secret_name"), a.get("environment")),
                "page_oncall": "Paged the %s on-call." % a.get("team"),
                "close_ticket": "Closed %s." % a.get("ticket_id"),
            }[name]
            return res, ans, "Done" if False else ans.split()[0]
        ans = "That failed: %s." % res["error"]
        return res, ans, res["error"]

    def toolset(self, need):
        k = self.r.randint(max(2, len(need)), 6)
        others = [n for n in TOOL_NAMES if n not in need]
        names = list(need) + self.r.sample(others, k - len(need))
        self.r.shuffle(names)
        return [TOOLS[n] for n in names]

    def case(self, kind=None):
        """A conversation: dict(messages, tools, expected, final) where messages is the context to
        complete and `expected` what the assistant writes next (taskeval form); `full` is a training
        conversation (list of messages incl. the expected turn and follow-ups)."""
        r = self.r
        kind = kind or r.choices(["call", "call2", "answer"], [0.62, 0.2, 0.18])[0]
        sysm = self.c(SYSTEMS)
        msgs = [{"role": "system", "content": sysm}] if sysm else []
        if kind == "call":
            name = self.c(TOOL_NAMES)
            text, a, ids = self.request(name)
            msgs.append({"role": "user", "content": text})
            call = {"name": name, "arguments": a}
            res, ans, key = self.result(name, a)
            full = msgs + [{"role": "assistant", "content": "", "tool_calls": [{"function": call}]},
                           {"role": "tool", "content": json.dumps(res, ensure_ascii=False)},
                           {"role": "assistant", "content": ans}]
            return dict(messages=msgs, tools=self.toolset([name]), expected={"calls": [dict(call, ids=ids)]},
                        full=full)
        if kind == "call2":
            n1, n2 = r.sample(TOOL_NAMES, 2)
            t1, a1, _ = self.request(n1)
            t2, a2, ids2 = self.request(n2)
            glue = self.c([" Then: ", " After that, ", " Next: ", " Also: "])
            t2l = t2[0].lower() + t2[1:] if glue.endswith(", ") else t2
            msgs.append({"role": "user", "content": t1 + glue + t2l})
            res1, _, _ = self.result(n1, a1)
            if not res1.get("ok", True):
                res1 = {"ok": True}
            msgs += [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": n1, "arguments": a1}}]},
                     {"role": "tool", "content": json.dumps(res1, ensure_ascii=False)}]
            call = {"name": n2, "arguments": a2}
            res2, ans2, _ = self.result(n2, a2)
            full = msgs + [{"role": "assistant", "content": "", "tool_calls": [{"function": call}]},
                           {"role": "tool", "content": json.dumps(res2, ensure_ascii=False)},
                           {"role": "assistant", "content": ans2}]
            return dict(messages=msgs, tools=self.toolset([n1, n2]), expected={"calls": [dict(call, ids=ids2)]},
                        full=full)
        # answer: report a tool result
        name = self.c(["get_service_status", "query_logs", "get_ticket", "create_incident", "run_backup"])
        text, a, _ = self.request(name)
        msgs.append({"role": "user", "content": text})
        res, ans, key = self.result(name, a)
        msgs += [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": name, "arguments": a}}]},
                 {"role": "tool", "content": json.dumps(res, ensure_ascii=False)}]
        full = msgs + [{"role": "assistant", "content": ans}]
        return dict(messages=msgs, tools=self.toolset([name]), expected={"answer": key}, full=full)


# ------------------------------------------------------------- rendering ----

def render_tools(tools):
    return ("Available tools (JSON schemas), one per line:\n<tools>"
            + "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
            + "\n</tools>\nTo call a tool, answer with <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>.")


def render_content(m):
    s = m.get("content") or ""
    for c in m.get("tool_calls") or []:
        f = c.get("function", c)
        s += "\n<tool_call>\n{\"name\": \"" + f["name"] + "\", \"arguments\": " + json.dumps(
            f["arguments"], ensure_ascii=False) + "}\n</tool_call>"
    return s


def render(messages, tools, add_generation_prompt):
    """Segments [(text, trained)] of the ChatML prompt; trained = assistant content + its <|im_end|>."""
    msgs = list(messages)
    has_sys = bool(msgs) and msgs[0]["role"] == "system"
    segs = []
    if tools and not has_sys:
        msgs.insert(0, {"role": "system", "content": render_tools(tools)})
    elif tools:
        msgs[0] = {"role": "system", "content": msgs[0]["content"] + "\n\n" + render_tools(tools)}
    for m in msgs:
        if m["role"] == "tool":
            segs.append(("<|im_start|>user\n<tool_response>\n" + m["content"] + "\n</tool_response><|im_end|>\n",
                         False))
        elif m["role"] == "assistant":
            segs.append(("<|im_start|>assistant\n", False))
            segs.append((render_content(m) + "<|im_end|>", True))
            segs.append(("\n", False))
        else:
            segs.append(("<|im_start|>" + m["role"] + "\n" + render_content(m) + "<|im_end|>\n", False))
    if add_generation_prompt:
        segs.append(("<|im_start|>assistant\n", False))
    return segs


def expected_text(expected):
    """The assistant turn a perfect model writes for `expected` (as rendered in training)."""
    if "calls" in expected:
        return render_content({"content": "", "tool_calls": [{"function": {"name": c["name"],
                                                                          "arguments": c["arguments"]}}
                                                             for c in expected["calls"]]})
    return None
