// The SIP phone's engine on JsSIP (vendor/jssip.min.js): what sipphone.js calls to register, call, send keys
// and hang up, and the events it reports back. Another SIP stack plugs in with the same `window.SipEngine`
// shape (the tests run the page on SIP.js that way).
"use strict";

(() => {
  function create(account, on) {
    const ua = new JsSIP.UA({
      sockets: [new JsSIP.WebSocketInterface(account.server)],
      uri: account.uri,
      authorization_user: account.user,
      password: account.password || undefined,
      register: false,
      session_timers: true,
    });
    const connected = new Promise((resolve) => ua.on("connected", resolve));
    let session = null;

    ua.on("registered", () => on.registration("registered"));
    ua.on("unregistered", () => on.registration("unregistered"));
    ua.on("registrationFailed", (e) => on.registration("failed", e.cause));
    ua.on("disconnected", () => on.log("the SIP connection is down; JsSIP retries"));
    ua.start();

    function watch(s) {
      s.on("progress", () => on.call("ringing"));
      s.on("accepted", () => on.call("answered"));
      s.on("confirmed", () => on.call("in call"));
      s.on("ended", (e) => on.call("ended", { by: e.originator, cause: e.cause }));
      s.on("failed", (e) => on.call("failed", { by: e.originator, cause: e.cause }));
      s.on("newDTMF", (e) => e.originator === "local" && on.log(`sent key ${e.dtmf.tone} (INFO)`));
    }

    return {
      register: () => connected.then(() => ua.register()),
      unregister: () => ua.unregister(),
      async call(target) {
        await connected;
        ua.once("newRTCSession", (e) => on.callId(e.request.call_id));
        session = ua.call(target, {
          mediaConstraints: { audio: true, video: false },
          pcConfig: { iceServers: account.iceServers },
        });
        watch(session);
        const pc = session.connection;
        on.peer(pc);
        pc.addEventListener("track", (e) => on.remoteStream(e.streams[0] || new MediaStream([e.track])));
      },
      dtmf: (digit) => session && session.sendDTMF(digit, { transportType: "INFO" }),
      mute(muted) {
        if (!session) return;
        if (muted) session.mute({ audio: true }); else session.unmute({ audio: true });
      },
      hangup: () => session && !session.isEnded() && session.terminate(),
      stop: () => ua.stop(),
    };
  }

  window.SipEngine = { name: `JsSIP ${JsSIP.version}`, create };
})();
