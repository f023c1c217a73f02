import Logging
import UploadProtocol

/// The answer to PLAN (SPEC §7.2): what uploading each blob of a selection would add to the account's quota use, by the
/// rule that admits OPENs (``QuotaUse``), read once per PLAN.
extension UploadPolicy {
    package func plan(account: Account, plan: Frame.Plan) async -> Result<Frame.Room, Refusal> {
        let catalog = self.catalog
        do {
            guard let current = try await self.currentAccount(of: account) else {
                return .failure(Refusal(code: .unauthenticated, message: Self.notPrincipal(account.name), keepSession: true))
            }
            let name = current.name
            let active = self.claims.activeUploads(of: name)
            let use = try await catalog.quotaUse(account: name, excludingKey: "", active: active)
            let used = Self.used(use)
            let limits = self.configuration.limits
            let keys = plan.entries.map { entry in
                try? ObjectKey(validating: entry.rawKey, maxLength: limits.maxKeyLength, maxSegmentLength: limits.maxKeySegmentLength)
            }
            // One read of the objects and one of the sessions for the whole PLAN, whatever its size.
            let valid = keys.compactMap { $0?.value }
            let objects = try await catalog.objects(account: name, keys: valid)
            let sessions = try await catalog.sessions(account: name, keys: valid)
            var needs: [UInt64] = []
            needs.reserveCapacity(plan.entries.count)
            for (entry, key) in zip(plan.entries, keys) {
                let size = Int64(entry.size)
                guard let key else {
                    needs.append(entry.size)
                    continue
                }
                let existing = objects[key.value]
                if existing != nil && !plan.overwrite {
                    // STORED, or ALREADY_EXISTS: neither adds.
                    needs.append(0)
                    continue
                }
                // What `used` counts for an unfinished or open upload of this key: its commit replaces it.
                var held: Int64 = 0
                if active[key.value] != nil || sessions[key.value] != nil {
                    let others = try await catalog.quotaUse(account: name, excludingKey: key.value, active: active)
                    held = max(0, used - Self.used(others))
                }
                needs.append(UInt64(max(0, size - (existing?.size ?? 0) - held)))
            }
            return .success(
                Frame.Room(request: plan.request, quota: current.quota.map { UInt64(max(0, $0)) }, used: UInt64(used), needs: needs)
            )
        } catch {
            let logger = self.logger
            logger.error("could not answer a PLAN", metadata: ["account": "\(account.name)", "error": "\(error)"])
            return .failure(
                Refusal(code: .internalError, message: "the relay could not read its catalog to answer PLAN; retry later", keepSession: true))
        }
    }

    /// Everything that counts against the quota, saturating at 2^62 (the wire's bound).
    private static func used(_ use: QuotaUse) -> Int64 {
        let (sum, overflow) = use.stored.addingReportingOverflow(use.committing)
        let (total, overflow2) = sum.addingReportingOverflow(use.staged)
        return overflow || overflow2 ? Int64(ProtocolLimits.maxBlobSize) : min(total, Int64(ProtocolLimits.maxBlobSize))
    }
}
