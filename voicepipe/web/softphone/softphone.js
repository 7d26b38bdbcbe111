// voicepipe softphone: calls the agent over WebRTC (POST /webrtc/offer) and shows the live transcript that
// the server sends on the "events" data channel (voicepipe's native protocol events). The keypad sends DTMF as
// RFC 4733 telephone events on the audio track (RTCDTMFSender), as a phone would. No dependencies.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const token = new URLSearchParams(location.search).get("token");
  const withToken = (path) => (token ? `${path}?token=${encodeURIComponent(token)}` : path);
  const ICE_GATHERING_TIMEOUT_MS = 5000;

  const phone = {
    pc: null,
    channel: null,
    stream: null,
    callId: null,
    state: "idle",
    events: [],  // every event received, for debugging and tests
  };
  window.softphone = phone;

  function setState(state, detail) {
    phone.state = state;
    $("status").textContent = detail ? `${state}: ${detail}` : state;
    $("call").disabled = !(state === "idle" || state === "ended" || state === "failed");
    $("hangup").disabled = !(state === "connecting" || state === "in call");
    for (const key of document.querySelectorAll("#keypad button")) key.disabled = state !== "in call";
  }

  // A key press: the audio sender's DTMF sender plays it as telephone events (the server's answer accepted them).
  function press(key) {
    const sender = phone.pc && phone.pc.getSenders().find((s) => s.track && s.track.kind === "audio");
    if (!sender || !sender.dtmf || !sender.dtmf.canInsertDTMF) {
      console.warn("voicepipe: this call cannot send keys");
      return;
    }
    sender.dtmf.insertDTMF(key, 100, 70);
  }

  // One transcript line per (role, turn); partials replace the line's text until the final arrives.
  function line(role, turn) {
    const id = `line-${role}-${turn}`;
    let li = document.getElementById(id);
    if (!li) {
      li = document.createElement("li");
      li.id = id;
      li.className = role;
      li.dataset.turn = String(turn);
      $("transcript").appendChild(li);
    }
    return li;
  }

  function onEvent(event) {
    phone.events.push(event);
    if (event.type === "started") {
      phone.callId = event.call_id;
    } else if (event.type === "transcript") {
      const li = line("user", event.turn);
      li.textContent = event.text;
      li.classList.toggle("partial", !event.final);
      if (event.final && !event.text.trim()) li.remove();
    } else if (event.type === "agent_text") {
      const li = line("agent", event.turn);
      li.textContent = event.final ? event.text : li.textContent + event.text;
      li.classList.toggle("partial", !event.final);
    } else if (event.type === "dtmf" || event.type === "transfer") {
      const li = document.createElement("li");
      li.className = "agent keys";
      li.textContent = event.type === "dtmf" ? `agent pressed ${event.digits}` : `transferring to ${event.target}`;
      $("transcript").appendChild(li);
    } else if (event.type === "error") {
      console.warn("voicepipe:", event.code, event.message);
    } else if (event.type === "closed") {
      setState("ended", event.reason);
    }
  }

  function iceGatheringDone(pc) {
    if (pc.iceGatheringState === "complete") return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        if (pc.iceGatheringState === "complete") {
          pc.removeEventListener("icegatheringstatechange", done);
          resolve();
        }
      };
      pc.addEventListener("icegatheringstatechange", done);
      setTimeout(resolve, ICE_GATHERING_TIMEOUT_MS);  // send what was gathered so far
    });
  }

  function callOptions() {
    const options = {};
    const prompt = $("system-prompt").value.trim();
    if (prompt) options.system_prompt = prompt;
    const greeting = $("greeting").value;
    if (greeting) options.greeting = greeting.trim() || null;
    return options;
  }

  async function call() {
    setState("connecting");
    $("transcript").replaceChildren();
    phone.events = [];
    try {
      const config = await (await fetch(withToken("/webrtc/config"))).json();
      const pc = new RTCPeerConnection({ iceServers: config.iceServers || [] });
      phone.pc = pc;
      pc.addEventListener("track", (e) => {
        $("agent-audio").srcObject = e.streams[0] || new MediaStream([e.track]);
        $("agent-audio").play().catch(() => {});
      });
      pc.addEventListener("connectionstatechange", () => {
        const s = pc.connectionState;
        if (s === "connected") setState("in call");
        else if (s === "failed" || s === "closed" || s === "disconnected") hangUp(s);
      });
      const channel = pc.createDataChannel("events");
      phone.channel = channel;
      channel.addEventListener("message", (e) => {
        try { onEvent(JSON.parse(e.data)); } catch (err) { console.warn("bad event", err); }
      });
      phone.stream = await navigator.mediaDevices.getUserMedia({
        audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true },
      });
      for (const track of phone.stream.getAudioTracks()) pc.addTrack(track, phone.stream);
      await pc.setLocalDescription(await pc.createOffer());
      await iceGatheringDone(pc);
      const resp = await fetch(withToken("/webrtc/offer"), {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ sdp: pc.localDescription.sdp, type: pc.localDescription.type, ...callOptions() }),
      });
      if (!resp.ok) {
        const text = await resp.text();
        let detail = text;
        try { detail = JSON.parse(text).detail || text; } catch (err) { /* not JSON: show it as it is */ }
        throw new Error(`${resp.status} ${String(detail).slice(0, 200)}`);
      }
      const answer = await resp.json();
      phone.callId = answer.call_id;
      await pc.setRemoteDescription({ sdp: answer.sdp, type: answer.type });
    } catch (err) {
      console.error(err);
      hangUp();
      setState("failed", String(err.message || err));
    }
  }

  function hangUp(reason) {
    const { pc, channel, stream } = phone;
    if (channel && channel.readyState === "open") channel.send(JSON.stringify({ type: "stop", reason: "hangup" }));
    if (stream) stream.getTracks().forEach((t) => t.stop());
    // Give the stop message a moment to leave before the connection goes.
    if (pc) setTimeout(() => pc.close(), 200);
    phone.pc = phone.channel = phone.stream = null;
    if (phone.state !== "failed") setState("ended", reason);
  }

  $("call").addEventListener("click", call);
  $("hangup").addEventListener("click", () => hangUp("hung up"));
  for (const key of document.querySelectorAll("#keypad button")) {
    key.addEventListener("click", () => press(key.dataset.key));
  }
  window.addEventListener("keydown", (e) => {
    if (phone.state === "in call" && /^[0-9*#]$/.test(e.key) && !e.target.closest("textarea, input")) press(e.key);
  });
  window.addEventListener("pagehide", () => hangUp("page closed"));
  setState("idle");
})();
