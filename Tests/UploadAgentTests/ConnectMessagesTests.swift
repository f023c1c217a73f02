import NIOCore
import Testing

@testable import UploadAgent

#if canImport(Glibc)
import Glibc
#endif

/// What a person reads when the agent cannot reach its relay: one line naming the problem and what to check, never
/// NIO's or BoringSSL's description of it (issue 27).
@Suite("Connection failures, in words")
struct ConnectMessagesTests {
    @Test("refused, timed out, unroutable, unresolvable: each says what to check; anything else stays as it is")
    func connectErrors() async {
        #expect(Uploader.reason(connectError: IOError(errnoCode: ECONNREFUSED, reason: "connect"), host: "h").contains("is upload-relay running"))
        #expect(Uploader.reason(connectError: IOError(errnoCode: EHOSTUNREACH, reason: "connect"), host: "h").contains("no route"))
        #expect(Uploader.reason(connectError: ChannelError.connectTimeout(.seconds(10)), host: "h").contains("no answer within 10 s"))
        #expect(
            Uploader.reason(connectError: SocketAddressError.unknown(host: "nas.local", port: 7443), host: "nas.local")
                == "cannot resolve \"nas.local\" (check the name in --relay, or the device's DNS)")
        #expect(Uploader.reason(connectError: ChannelError.ioOnClosedChannel, host: "h") == "\(ChannelError.ioOnClosedChannel)")
    }

    @Test("a TLS handshake that fails says whether the server is no upload-relay, speaks no TLS, or what BoringSSL's code was")
    func handshakeReasons() async {
        let alpn =
            "handshakeFailed(NIOSSL.BoringSSLError.sslError([Error: 268436576 error:10000460:SSL routines:OPENSSL_internal:TLSV1_ALERT_NO_APPLICATION_PROTOCOL at /x/ssl/tls_record.cc:491]))"
        #expect(TransportFailure.handshakeReason(alpn).contains("not an upload-relay"))
        let plain =
            "handshakeFailed(NIOSSL.BoringSSLError.sslError([Error: 268435703 error:100000f7:SSL routines:OPENSSL_internal:WRONG_VERSION_NUMBER at /x/ssl/tls_record.cc:231]))"
        #expect(TransportFailure.handshakeReason(plain).contains("does not speak TLS"))
        let other = "handshakeFailed(NIOSSL.BoringSSLError.sslError([Error: 1 error:1:SSL routines:OPENSSL_internal:SOMETHING_ELSE at /x/y.cc:1]))"
        #expect(TransportFailure.handshakeReason(other) == "SOMETHING_ELSE (check --relay and --ca)")
        #expect(TransportFailure.handshakeReason("handshakeFailed(...)").contains("ended the handshake"))
    }
}
