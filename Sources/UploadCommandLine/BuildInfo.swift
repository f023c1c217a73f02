import CUploadSystem
import UploadProtocol

/// What a binary says of itself with `--version`: the release, the wire protocol versions it speaks, and the commit it
/// was built from. The release number lives here and nowhere else (tools/package reads it from this file).
public enum BuildInfo {
    /// The release, as in CHANGELOG.md.
    public static let version = "1.0.0"

    /// The commit the binary was built from; "unknown" for a build that did not say (a plain `swift build`).
    public static var commit: String { String(cString: upload_build_commit()) }

    /// `program`'s line for `--version`: "upload-agent 1.0.0 (wire protocol 1, commit 8898615)".
    public static func versionLine(_ program: String) -> String {
        let protocols = ProtocolLimits.supportedVersions
        let wire = protocols.count == 1 ? "\(protocols.lowerBound)" : "\(protocols.lowerBound)-\(protocols.upperBound)"
        return "\(program) \(Self.version) (wire protocol \(wire), commit \(Self.commit))"
    }
}
