// The SIP.js bundle of the browser tests (tests/browser/sipjs/): the library as the global `SIP`.
import * as SIP from "sip.js";

window.SIP = SIP;
