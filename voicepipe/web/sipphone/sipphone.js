// voicepipe SIP phone: registers with voicepipe's SIP endpoint (/sip, SIP over WebSocket), calls an agent, sends
// keypad digits by SIP INFO and hangs up. The SIP stack is `window.SipEngine` (jssip-engine.js); this file is
// the page. `window.sipphone` holds the state, for tests.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const token = new URLSearchParams(location.search).get("token");
  const withToken = (path) => (token ? `${path}?token=${encodeURIComponent(token)}` : path);
  const SAVED = ["server", "user", "agent"];
  const MAX_LOG = 40;

  const phone = {
    engine: window.SipEngine.name,
    ready: false,  // the page has its settings (/sip/config)
    registration: "unregistered",
    state: "idle",
    endedBy: null,  // "local" or "remote", once a call has ended
    cause: null,
    callId: null,  // the SIP Call-ID of the latest call
    pc: null,
    keysSent: [],
    log: [],
  };
  window.sipphone = phone;
  let config = { domain: null, iceServers: [], agents: [] };
  let engine = null;
  let engineAccount = "";
  let muted = false;

  function log(text) {
    phone.log.push(text);
    const li = document.createElement("li");
    li.textContent = `${new Date().toLocaleTimeString()} ${text}`;
    $("log").prepend(li);
    while ($("log").children.length > MAX_LOG) $("log").lastChild.remove();
  }

  function setRegistration(state, cause) {
    phone.registration = state;
    $("registration").textContent = cause ? `${state}: ${cause}` : state === "unregistered" ? "not registered" : state;
    $("register").textContent = state === "registered" ? "Unregister" : "Register";
    log(`registration ${state}${cause ? ` (${cause})` : ""}`);
  }

  function setState(state, detail) {
    phone.state = state;
    $("status").textContent = detail ? `${state}: ${detail}` : state;
    const live = ["calling", "ringing", "answered", "in call"].includes(state);
    $("call").disabled = live;
    $("hangup").disabled = !live;
    $("mute").disabled = state !== "in call";
    for (const key of $("keypad").querySelectorAll("button")) key.disabled = state !== "in call";
    if (!live) setMute(false);
  }

  function setMute(on) {
    muted = on;
    $("mute").setAttribute("aria-pressed", String(on));
    $("mute").textContent = on ? "Unmute" : "Mute";
  }

  function account() {
    const domain = config.domain || location.hostname;
    const user = $("user").value.trim() || "guest";
    return {
      server: $("server").value.trim(), uri: `sip:${user}@${domain}`, user, password: $("password").value, domain,
      iceServers: config.iceServers || [],
    };
  }

  // One engine (one SIP connection) per account; changing the account starts a new one.
  function currentEngine() {
    const a = account();
    const key = JSON.stringify(a);
    if (engine && key === engineAccount) return engine;
    if (engine) engine.stop();
    engineAccount = key;
    for (const name of SAVED) localStorage.setItem(`voicepipe.sip.${name}`, $(name).value);
    engine = window.SipEngine.create(a, {
      registration: setRegistration,
      call(state, detail) {
        if (state === "ended" || state === "failed") {
          phone.endedBy = detail.by;
          phone.cause = detail.cause;
          setState(state, `${detail.by === "local" ? "you hung up" : "the agent hung up"} (${detail.cause})`);
        } else {
          setState(state);
        }
        log(`call ${state}${detail ? ` by ${detail.by} (${detail.cause})` : ""}`);
      },
      callId: (id) => { phone.callId = id; },
      peer: (pc) => { phone.pc = pc; },
      remoteStream(stream) {
        $("remote-audio").srcObject = stream;
        $("remote-audio").play().catch(() => {});
      },
      log,
    });
    return engine;
  }

  $("register").addEventListener("click", () => {
    if (phone.registration === "registered") currentEngine().unregister();
    else {
      setRegistration("registering");
      currentEngine().register();
    }
  });

  $("call").addEventListener("click", async () => {
    const agent = $("agent").value.trim() || "agent";
    phone.endedBy = phone.cause = phone.callId = null;
    phone.keysSent = [];
    setState("calling", `sip:${agent}@${account().domain}`);
    try {
      await currentEngine().call(`sip:${agent}@${account().domain}`);
    } catch (err) {
      console.error(err);
      setState("failed", String(err.message || err));
    }
  });

  $("hangup").addEventListener("click", () => engine && engine.hangup());
  $("mute").addEventListener("click", () => {
    setMute(!muted);
    engine.mute(muted);
  });

  function press(digit) {
    if (phone.state !== "in call") return;
    phone.keysSent.push(digit);
    engine.dtmf(digit);
  }
  for (const key of $("keypad").querySelectorAll("button")) key.addEventListener("click", () => press(key.dataset.digit));
  document.addEventListener("keydown", (e) => {
    if (e.target.tagName !== "INPUT" && /^[0-9*#]$/.test(e.key)) press(e.key);
  });

  async function init() {
    $("engine").textContent = phone.engine;
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    $("server").value = `${scheme}://${location.host}${withToken("/sip")}`;
    for (const name of SAVED) {
      const saved = localStorage.getItem(`voicepipe.sip.${name}`);
      if (saved) $(name).value = saved;
    }
    try {
      const resp = await fetch(withToken("/sip/config"));
      if (resp.ok) config = await resp.json();
    } catch (err) {
      log(`no /sip/config: ${err}`);
    }
    const agents = config.agents || [];
    if (!localStorage.getItem("voicepipe.sip.agent") && agents.length) $("agent").value = agents[0];
    for (const name of agents) {
      const option = document.createElement("option");
      option.value = name;
      $("agents").appendChild(option);
    }
    if (config.auth) $("password").placeholder = "(the server asks for one)";
    setState("idle");
    phone.ready = true;
  }

  window.addEventListener("pagehide", () => engine && engine.stop());
  init();
})();
