// The JsSIP bundle of the SIP web phone (voicepipe/web/sipphone/): the library as the global `JsSIP`.
import JsSIP from "jssip";

window.JsSIP = JsSIP;
