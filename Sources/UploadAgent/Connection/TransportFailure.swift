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
                self = .handshake(text, untrustedCertificate: text.contains("CERTIFICATE_VERIFY_FAILED"))
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
