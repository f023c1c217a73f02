import NIOCore
import NIOSSL

/// Why the transport failed, as the handler saw it (the session words it and decides whether retrying can help).
enum TransportFailure: Hashable, Sendable {
    /// The TLS handshake failed; `untrustedCertificate` when the relay's certificate did not verify against the CA.
    case handshake(String, untrustedCertificate: Bool)
    /// The relay's certificate does not name the host asked for.
    case hostnameMismatch(String)
    case tls(String)
    case io(String)
    case other(String)
}

extension TransportFailure {
    /// What the channel's error says about the transport, in the words the session reports.
    init(_ error: any Error) {
        switch error {
        case let tls as NIOSSLError:
            if case .handshakeFailed = tls {
                let text = "\(tls)"
                if text.contains("EOF during handshake") {
                    // No alert, the socket just closed: a relay at its connection limit, or restarting, or a balancer
                    // with no relay behind it. Not the certificate's fault: retried like any broken link.
                    self = .io("the relay closed the connection during the TLS handshake (full, restarting, or not behind this address): \(text)")
                    return
                }
                self = .handshake(Self.handshakeReason(text), untrustedCertificate: text.contains("CERTIFICATE_VERIFY_FAILED"))
            } else {
                self = .tls("\(tls)")
            }
        case let extra as NIOSSLExtraError where extra == .failedToValidateHostname:
            self = .hostnameMismatch("\(extra)")
        case let io as IOError:
            self = .io("\(io)")
        default:
            self = .other("\(error)")
        }
    }
}

extension TransportFailure {
    /// BoringSSL's reason code in `text` (`...:OPENSSL_internal:WRONG_VERSION_NUMBER at ...`), worded for the user, never
    /// the library's whole description.
    static func handshakeReason(_ text: String) -> String {
        let code = text.split(separator: ":").map { $0.split(separator: " ").first.map(String.init) ?? "" }
            .last { !$0.isEmpty && $0.allSatisfy { $0.isUppercase || $0.isNumber || $0 == "_" } && $0.count > 3 }
        switch code {
        case "TLSV1_ALERT_NO_APPLICATION_PROTOCOL":
            return "the server at that address is not an upload-relay (it does not speak the upload protocol over TLS); check --relay"
        case "WRONG_VERSION_NUMBER", "HTTP_REQUEST", "PACKET_LENGTH_TOO_LONG":
            return "the server at that address does not speak TLS as upload-relay does; check --relay's port"
        case "TLSV1_ALERT_PROTOCOL_VERSION", "UNSUPPORTED_PROTOCOL":
            return "the server does not speak TLS 1.3, as upload-relay does; check --relay"
        case let code?:
            return "\(code) (check --relay and --ca)"
        case nil:
            return "the server ended the handshake (check --relay and --ca)"
        }
    }
}
