#if canImport(Glibc)
import Glibc
#endif
import CUploadCertificates
import Foundation

/// `upload-relay serve --dev`: a private CA and a server certificate for localhost, 127.0.0.1, ::1 and the names
/// the relay is reached by (its listen address, or this host's name and addresses, and any `--dev-host`).
public enum DevCertificates {
    /// The files `--dev` writes under `DIR/dev/`.
    public struct Paths: Sendable {
        public var directory: String
        public var caCertificate: String { self.directory + "/ca.pem" }
        public var serverCertificate: String { self.directory + "/server.pem" }
        public var serverKey: String { self.directory + "/server-key.pem" }
        public var caKey: String { self.directory + "/ca-key.pem" }
        public var token: String { self.directory + "/token" }
        /// The names the server certificate was made for, one a line: a change makes it anew.
        public var serverNames: String { self.directory + "/server-names" }

        public init(dataDirectory: String) {
            self.directory = dataDirectory + "/dev"
        }
    }

    /// Names and addresses for the server certificate: localhost and the loopback addresses always, then `names`
    /// (IP addresses become IP entries, anything else a DNS name), without repeats.
    public static func subjectNames(_ names: [String]) -> [String] {
        var seen = Set<String>()
        return (["localhost", "127.0.0.1", "::1"] + names).filter { !$0.isEmpty && seen.insert($0.lowercased()).inserted }
    }

    /// Creates the CA (once) and a server certificate for `names` (see ``subjectNames(_:)``), made anew when the
    /// names changed. Returns whether it made the server certificate.
    @discardableResult
    public static func ensure(_ paths: Paths, names: [String] = []) throws -> Bool {
        let files = FileManager.default
        let wanted = Self.subjectNames(names)
        let recorded = (try? String(contentsOfFile: paths.serverNames, encoding: .utf8))?.split(separator: "\n").map(String.init)
        let haveCA = files.fileExists(atPath: paths.caCertificate) && files.fileExists(atPath: paths.caKey)
        if haveCA && files.fileExists(atPath: paths.serverCertificate) && files.fileExists(atPath: paths.serverKey)
            && (recorded == wanted || (recorded == nil && names.isEmpty))
        {
            return false
        }
        try files.createDirectory(atPath: paths.directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        let organization = "upload-relay dev"
        var caKey = haveCA ? (try? String(contentsOfFile: paths.caKey, encoding: .utf8)) : nil
        var caCertificate = haveCA ? (try? String(contentsOfFile: paths.caCertificate, encoding: .utf8)) : nil
        if caKey.map({ upload_certificates_key_is_valid($0) != 1 }) ?? true || caCertificate == nil {
            // A new CA: agents must be given the new ca.pem.
            let key = try Self.makeKey()
            let certificate = try Self.makeCertificate(
                subjectKey: key, issuerKey: key, issuerCertificate: nil, organization: organization, commonName: "upload-relay dev CA",
                days: 3650
            )
            try self.write(key, to: paths.caKey, mode: 0o600)
            try self.write(certificate, to: paths.caCertificate, mode: 0o644)
            (caKey, caCertificate) = (key, certificate)
        }
        guard let caKey, let caCertificate else { throw DevCertificateError(description: "no CA key and certificate in \(paths.directory)") }
        let serverKey = try Self.makeKey()
        let server = try Self.makeCertificate(
            subjectKey: serverKey, issuerKey: caKey, issuerCertificate: caCertificate, organization: organization,
            commonName: wanted.first(where: { !Self.isIPAddress($0) && $0 != "localhost" }) ?? "localhost", days: 825,
            dnsNames: wanted.filter { !Self.isIPAddress($0) }, ipAddresses: wanted.filter(Self.isIPAddress)
        )
        try self.write(server, to: paths.serverCertificate, mode: 0o644)
        try self.write(serverKey, to: paths.serverKey, mode: 0o600)
        try self.write(wanted.joined(separator: "\n"), to: paths.serverNames, mode: 0o644)
        return true
    }

    /// What libcrypto said when a key or certificate could not be made.
    struct DevCertificateError: Error, CustomStringConvertible {
        var description: String
    }

    /// A new P-256 private key, PKCS#8 PEM.
    static func makeKey() throws -> String {
        var pem: UnsafeMutablePointer<CChar>?
        var error: UnsafeMutablePointer<CChar>?
        defer {
            upload_certificates_free(pem)
            upload_certificates_free(error)
        }
        guard upload_certificates_make_key(&pem, &error) == 0, let pem else {
            throw DevCertificateError(description: error.map { String(cString: $0) } ?? "cannot make a key")
        }
        return String(cString: pem)
    }

    /// A certificate (PEM) for `subjectKey`'s public key signed by `issuerKey`: a self-signed CA when
    /// `issuerCertificate` is nil, else a server certificate for `dnsNames` and `ipAddresses` issued by that CA.
    static func makeCertificate(
        subjectKey: String, issuerKey: String, issuerCertificate: String?, organization: String, commonName: String, days: Int32,
        dnsNames: [String] = [], ipAddresses: [String] = []
    ) throws -> String {
        var pem: UnsafeMutablePointer<CChar>?
        var error: UnsafeMutablePointer<CChar>?
        defer {
            upload_certificates_free(pem)
            upload_certificates_free(error)
        }
        let dns = dnsNames.map { strdup($0) }
        let ips = ipAddresses.map { strdup($0) }
        defer { for pointer in dns + ips { free(pointer) } }
        let status = dns.map { UnsafePointer($0) }.withUnsafeBufferPointer { dns in
            ips.map { UnsafePointer($0) }.withUnsafeBufferPointer { ips in
                upload_certificates_make_certificate(
                    subjectKey, issuerKey, issuerCertificate, organization, commonName, days, dns.baseAddress, Int32(dns.count),
                    ips.baseAddress, Int32(ips.count), &pem, &error
                )
            }
        }
        guard status == 0, let pem else {
            throw DevCertificateError(description: error.map { String(cString: $0) } ?? "cannot make a certificate")
        }
        return String(cString: pem)
    }

    public static func isIPAddress(_ text: String) -> Bool {
        self.ipAddressBytes(text) != nil
    }

    /// The 4 or 16 bytes of an IPv4 or IPv6 address in text, or nil for a name.
    static func ipAddressBytes(_ text: String) -> [UInt8]? {
        var v4 = in_addr()
        if inet_pton(AF_INET, text, &v4) == 1 {
            return withUnsafeBytes(of: &v4) { Array($0) }
        }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, text, &v6) == 1 {
            return withUnsafeBytes(of: &v6) { Array($0) }
        }
        return nil
    }

    /// A NUL-terminated C string held in an array.
    private static func string(_ chars: [CChar]) -> String {
        String(decoding: chars.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// This host's name and the addresses of its interfaces (loopback and link-local left out): what a `--dev` relay
    /// listening on every address is reached by.
    public static func localNames() -> [String] {
        var names: [String] = []
        var host = [CChar](repeating: 0, count: 256)
        if gethostname(&host, host.count) == 0 {
            names.append(Self.string(host))
        }
        var list: UnsafeMutablePointer<ifaddrs>? = nil
        guard getifaddrs(&list) == 0, let first = list else { return names }
        defer { freeifaddrs(list) }
        var cursor: UnsafeMutablePointer<ifaddrs>? = first
        while let entry = cursor {
            defer { cursor = entry.pointee.ifa_next }
            guard let address = entry.pointee.ifa_addr else { continue }
            var text = [CChar](repeating: 0, count: Int(NI_MAXHOST))
            let family = Int32(address.pointee.sa_family)
            let length = family == AF_INET ? MemoryLayout<sockaddr_in>.size : family == AF_INET6 ? MemoryLayout<sockaddr_in6>.size : 0
            guard length > 0, getnameinfo(address, socklen_t(length), &text, socklen_t(text.count), nil, 0, NI_NUMERICHOST) == 0 else {
                continue
            }
            let name = Self.string(text)
            if name.hasPrefix("127.") || name == "::1" || name.lowercased().hasPrefix("fe80") { continue }
            names.append(name)
        }
        return names
    }

    static func write(_ text: String, to path: String, mode: Int) throws {
        let temporary = path + ".tmp"
        guard FileManager.default.createFile(atPath: temporary, contents: Data(text.utf8), attributes: [.posixPermissions: mode]) else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: temporary])
        }
        guard rename(temporary, path) == 0 else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: path])
        }
    }
}
