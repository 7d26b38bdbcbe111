// The SIP phone page's engine on SIP.js 0.21 (sip.min.js), for the browser tests: the same `window.SipEngine`
// shape as voicepipe/web/sipphone/jssip-engine.js, through SIP.js's own API (UserAgent, Registerer, Inviter).
// Keys go as INFO with `application/dtmf` (JsSIP sends `application/dtmf-relay`), so the two cover both.
"use strict";

(() => {
  const { UserAgent, Registerer, RegistererState, Inviter, SessionState } = SIP;

  function create(account, on) {
    const ua = new UserAgent({
      uri: UserAgent.makeURI(account.uri),
      transportOptions: { server: account.server },
      authorizationUsername: account.user,
      authorizationPassword: account.password || undefined,
      logLevel: "warn",
      sessionDescriptionHandlerFactoryOptions: {
        peerConnectionConfiguration: { iceServers: account.iceServers },
        iceGatheringTimeout: 3000,
      },
    });
    const started = ua.start();
    const registerer = new Registerer(ua);
    registerer.stateChange.addListener((state) => {
      if (state === RegistererState.Registered) on.registration("registered");
      else if (state === RegistererState.Unregistered) on.registration("unregistered");
    });
    let session = null;

    function watch(inviter) {
      let established = false;
      let hungUpHere = false;
      let cause = "Terminated";
      inviter.stateChange.addListener((state) => {
        if (state === SessionState.Established) {
          established = true;
          const sdh = inviter.sessionDescriptionHandler;
          on.peer(sdh.peerConnection);
          on.remoteStream(sdh.remoteMediaStream);
          on.call("in call");
        } else if (state === SessionState.Terminated) {
          const by = hungUpHere ? "local" : "remote";
          on.call(established ? "ended" : "failed", { by, cause: hungUpHere ? "Terminated" : cause });
        }
      });
      return {
        hangUp() {
          hungUpHere = true;
          return established ? inviter.bye() : inviter.cancel();
        },
        rejected(response) {
          cause = `${response.message.statusCode} ${response.message.reasonPhrase}`;
        },
      };
    }

    return {
      register: () => started.then(() => registerer.register({
        requestDelegate: { onReject: (r) => on.registration("failed", `${r.message.statusCode} ${r.message.reasonPhrase}`) },
      })),
      unregister: () => registerer.unregister(),
      async call(target) {
        await started;
        const inviter = new Inviter(ua, UserAgent.makeURI(target), {
          sessionDescriptionHandlerOptions: { constraints: { audio: true, video: false } },
        });
        const watched = watch(inviter);
        session = { inviter, ...watched };
        on.callId(inviter.request.callId);
        await inviter.invite({ requestDelegate: { onReject: watched.rejected } });
      },
      dtmf: (digit) => session && session.inviter.info({
        requestOptions: { body: { contentDisposition: "render", contentType: "application/dtmf", content: digit } },
      }).then(() => on.log(`sent key ${digit} (INFO)`)),
      mute: (muted) => session && session.inviter.sessionDescriptionHandler.enableSenderTracks(!muted),
      hangup: () => session && session.hangUp(),
      stop: () => ua.stop(),
    };
  }

  window.SipEngine = { name: `SIP.js ${SIP.version}`, create };
})();
